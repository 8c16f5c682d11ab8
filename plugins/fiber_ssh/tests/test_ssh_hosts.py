"""Hosts from ssh_hosts and ssh_hostfile: what is accepted, and the errors that name the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fiber_ssh.hosts import hosts_from_config, parse_hostfile, parse_hosts
from hypothesis import given
from hypothesis import strategies as st

import fibercore as fc
from fibercore.errors import ConfigError
from fibercore.testing.targets import sleep_for


def test_hosts_with_and_without_slots() -> None:
    hosts = parse_hosts("a:4, me@b.example.org:8,c")
    assert [(h.name, h.user, h.address, h.slots) for h in hosts] == [
        ("a", None, "a", 4), ("me@b.example.org", "me", "b.example.org", 8), ("c", None, "c", None)]


def test_hostfile_keys_and_comments(tmp_path: Path) -> None:
    path = tmp_path / "hosts"
    path.write_text("# lab\n\ngpu1 slots=8\nme@gpu2 slots=2 port=2222 python=/opt/py/bin/python  # conda\n")
    one, two = parse_hostfile(str(path))
    assert (one.name, one.slots, one.port) == ("gpu1", 8, None)
    assert (two.name, two.slots, two.port, two.python) == ("me@gpu2", 2, 2222, "/opt/py/bin/python")


@pytest.mark.parametrize("line, message", [
    ("gpu1 slots=0", "positive integer"),
    ("gpu1 slots", "not key=value"),
    ("gpu1 colour=red", "unknown key 'colour'"),
    ("-oProxyCommand=evil", "not a host name"),
    ("a;rm -rf /", "not a host name"),
])
def test_hostfile_errors_name_the_line_and_the_fix(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "hosts"
    path.write_text(f"ok slots=1\n{line}\n")
    with pytest.raises(ConfigError, match=message) as info:
        parse_hostfile(str(path))
    assert f"{path}:2" in str(info.value)


def test_no_hosts_and_duplicates_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="FIBER_SSH_HOSTS"):
        hosts_from_config(None, None)
    with pytest.raises(ConfigError, match="listed twice"):
        hosts_from_config("a:2,a:3", None)
    with pytest.raises(ConfigError, match="cannot be read"):
        hosts_from_config(None, str(tmp_path / "missing"))


@given(st.lists(st.tuples(st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5})?", fullmatch=True),
                          st.one_of(st.none(), st.integers(1, 512))), min_size=1, max_size=6,
                unique_by=lambda t: t[0]))
def test_hosts_round_trip(entries: list[tuple[str, int | None]]) -> None:
    text = ",".join(name if slots is None else f"{name}:{slots}" for name, slots in entries)
    assert [(h.name, h.slots) for h in parse_hosts(text)] == entries


@fc.meta(cpu=64)
def needs_64_cpus() -> None:
    """Never runs: no host has 64 slots."""


def test_a_job_larger_than_every_host_fails_start_with_the_fix(ssh_config: dict[str, Any]) -> None:
    fc.init(backend="ssh", **ssh_config)
    try:
        p = fc.Process(target=needs_64_cpus)
        with pytest.raises(fc.ProcessError, match="largest host has 8"):
            p.start()
    finally:
        fc.init()


def test_the_secret_is_on_no_command_line(ssh_config: dict[str, Any]) -> None:
    """While a job runs, no process of this machine (ssh client, sshd, launcher, worker)
    carries the session secret in its argv."""
    fc.init(backend="ssh", **ssh_config)
    try:
        secret = fc.get_runtime().secret.hex().encode()
        p = fc.Process(target=sleep_for, args=(30,))
        p.start()
        seen = 0
        for pid in filter(str.isdigit, __import__("os").listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            seen += 1
            assert secret not in cmdline, f"process {pid} has the secret on its command line"
        assert seen > 10
        p.kill()
        p.join(30)
    finally:
        fc.init()


def test_ssh_gives_up_on_a_silent_host_after_the_cores_bound_not_sooner() -> None:
    from fiber_ssh.engine import alive_probes

    for interval, timeout in ((0.5, 4.0), (2.0, 20.0), (3.0, 10.0), (None, None)):
        every, count = alive_probes(interval, timeout)
        assert every >= 1 and every * count >= (timeout or 20.0)
        assert every * count < (timeout or 20.0) + every
