"""Hosts that cannot run a job (nothing listens, the key is refused): each is skipped with its
own ssh error, and the job runs on a host that works."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

import fibercore as fc
from fibercore.testing.targets import sleep_for


def test_each_failing_host_is_skipped_with_its_own_words(ssh_config: dict[str, Any],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """A job tried on two hosts nobody answers on (127.0.0.2 and .3: the test sshd listens on
    127.0.0.1 only) before the one that works: each host's "skipped" line carries that host's
    ssh error, not the one of the host tried before it (the job's output of earlier sessions)."""
    config = dict(ssh_config, ssh_hosts="127.0.0.2:1,127.0.0.3:1,127.0.0.1:8", ssh_host_retry=60)
    fc.init(backend="ssh", **config)
    caplog.set_level(logging.WARNING, logger="fiber_ssh")
    try:
        jobs = [fc.Process(target=sleep_for, args=(0,)) for _ in range(3)]
        for job in jobs:
            job.start()
        for job in jobs:
            job.join(60)
        assert [job.exitcode for job in jobs] == [0, 0, 0]
    finally:
        fc.init()
    skipped = [r.getMessage() for r in caplog.records if "is skipped" in r.getMessage()]
    for address in ("127.0.0.2", "127.0.0.3"):
        lines = [line for line in skipped if line.startswith(f"fiber-ssh: host {address}")]
        assert lines, skipped
        for line in lines:
            other = "127.0.0.3" if address == "127.0.0.2" else "127.0.0.2"
            assert address in line.split(": ", 2)[2] and other not in line, line


def _start_fails(config: dict[str, Any]) -> str:
    """The error of a job's start() on the ssh backend with ``config``."""
    fc.init(backend="ssh", **config)
    try:
        job = fc.Process(target=sleep_for, args=(0,))
        with pytest.raises(fc.ProcessError) as failed:
            job.start()
    finally:
        fc.init()
    return str(failed.value)


def test_a_job_no_host_can_start_fails_with_the_ssh_error_and_the_fix(ssh_config: dict[str, Any]) -> None:
    """Every host refuses (nothing listens): after two sessions per host the start fails with
    ssh's own words and what to check, instead of waiting out start_timeout (it did: the
    count of tries was a set of host names, so the job was tried again and again)."""
    text = _start_fails(dict(ssh_config, ssh_hosts="127.0.0.2:1,127.0.0.3:1", ssh_host_retry=1))
    assert "before connecting" in text and "within" not in text.split("\n")[0], text
    assert "could not start it on any host (4 ssh sessions failed" in text, text
    assert "Connection refused" in text and "fiber doctor" in text, text


def test_a_job_waits_for_a_busy_host_while_the_others_refuse_it(ssh_config: dict[str, Any],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """One host refuses (nothing listens), the other is full: a job that never ran is not
    given up after its sessions on the refusing host (the full one never failed it); it starts
    when the full host's slot frees."""
    fc.init(backend="ssh", **dict(ssh_config, ssh_hosts="127.0.0.2:1,127.0.0.1:1", ssh_host_retry=1))
    caplog.set_level(logging.WARNING, logger="fiber_ssh")
    try:
        busy = fc.Process(target=sleep_for, args=(600,))
        busy.start()  # on 127.0.0.1 (the other host refuses it)
        waiting = fc.Process(target=sleep_for, args=(0,))
        starter = threading.Thread(target=waiting.start)
        starter.start()
        deadline = time.monotonic() + 120
        while sum("host 127.0.0.2 is skipped" in r.getMessage() for r in caplog.records) < 5:
            assert time.monotonic() < deadline and starter.is_alive(), "the waiting job gave up"
            time.sleep(0.05)
        busy.kill()
        busy.join(30)
        starter.join(60)
        waiting.join(60)
        assert waiting.exitcode == 0
    finally:
        fc.init()


def test_a_host_without_the_python_named_says_so_not_the_key(ssh_config: dict[str, Any]) -> None:
    """ssh gets in but the host has no Python at the path given (the shell's exit 127): the
    start fails naming that path and python=/ssh_python, not keys and known_hosts."""
    text = _start_fails(dict(ssh_config, ssh_python="/nonexistent/python3", ssh_host_retry=1))
    assert "ssh exit 127" in text and "the host has no Python at /nonexistent/python3" in text, text
    assert "python= for the host in ssh_hostfile (or ssh_python)" in text and "known_hosts" not in text, text


def test_doctor_tells_a_missing_python_from_a_refused_key(ssh_config: dict[str, Any]) -> None:
    from fibercore.testing import fiber

    env = {"FIBER_BACKEND": "ssh", "FIBER_LISTEN_HOST": "127.0.0.1",
           **{f"FIBER_{key.upper()}": str(value) for key, value in ssh_config.items()},
           "FIBER_SSH_PYTHON": "/nonexistent/python3"}
    doctor = fiber("doctor", "--backend", "ssh", env=env)
    out = doctor.stdout
    assert doctor.returncode == 1, out
    assert "ok   127.0.0.1 reachable with keys (BatchMode)" in out, out
    assert "no   127.0.0.1 runs Python with fibercore" in out and "exit 127" in out, out
    assert "fix: the host has no Python at /nonexistent/python3" in out and "known_hosts" not in out, out
    env["FIBER_SSH_HOSTS"] = "127.0.0.2:1"  # nothing listens there: ssh's own failure, the key advice
    out = fiber("doctor", "--backend", "ssh", env=env).stdout
    assert "no   127.0.0.2 reachable with keys (BatchMode)" in out and "known_hosts" in out, out


def _launcher_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


def test_a_host_that_does_not_answer_a_kill_gets_no_new_job(ssh_config: dict[str, Any], local_sshd: Any,
                                                            tmp_path: Any) -> None:
    """The core declared a job lost (its host cut off before ssh's probes noticed) and killed
    it; the host does not answer. A new job goes to the other host, not to the cut-off one it
    preferred (a newcomer saw a replacement worker placed there), and once the kill has gone
    unanswered for KILL_WAIT the host is skipped. The cut-off host is simulated by stopping the
    job's launcher (SIGSTOP), so the kill is never read."""
    import os
    import signal

    from fiber_ssh.engine import KILL_ANSWER, KILL_WAIT

    alias = tmp_path / "ssh_config"  # a second name for the same sshd: a second host to fiber-ssh
    alias.write_text(f"Host second\n  HostName 127.0.0.1\n  HostKeyAlias [127.0.0.1]:{local_sshd.port}\n")
    config = dict(ssh_config, ssh_hosts="127.0.0.1:8,second:8",
                  ssh_options=f"{ssh_config['ssh_options']} -F {alias}", ssh_host_retry=60)
    fc.init(backend="ssh", **config)
    stopped: list[int] = []
    cut = fc.Process(target=sleep_for, args=(600,), daemon=True)
    other = fc.Process(target=sleep_for, args=(600,), daemon=True)
    try:
        cut.start()
        other.start()
        host_of = {p: p._popen.job.data.host.name for p in (cut, other)}
        assert host_of == {cut: "127.0.0.1", other: "second"}  # equal load now: the first host is chosen
        job = cut._popen.job.data
        assert job.started.wait(60) and job.pid
        for pid in (_launcher_of(job.pid), job.pid):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        cut.kill()  # as the pool does with a worker the heartbeat declared lost
        sent = job.kill_sent
        while time.monotonic() - sent <= KILL_ANSWER:
            time.sleep(0.05)
        assert not job.done.is_set()
        new = fc.Process(target=sleep_for, args=(0,))
        new.start()
        assert new._popen.job.data.host.name == "second"
        new.join(60)
        assert new.exitcode == 0
        cut.join(KILL_WAIT + 30)
        assert cut.exitcode == -signal.SIGKILL
        assert job.host.down_until > time.monotonic() and "did not answer a kill" in job.host.down_reason
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        for p in (cut, other):
            if p._popen is not None:
                p.kill()
                p.join(30)
        fc.init()


def test_a_job_whose_daemon_keeps_its_output_open_does_not_mark_its_host_down(ssh_config: dict[str, Any],
                                                                              tmp_path: Any) -> None:
    """The job started a process in a session of its own that holds the job's output open: its
    kill is carried out (the launcher says so) but the session does not end by itself. After
    KILL_WAIT the session is ended; the host, which answered, stays in use (a review found
    such a host marked down for ssh_host_retry)."""
    import os
    import signal
    import subprocess

    from fiber_ssh.engine import KILL_WAIT

    pid_file = tmp_path / "daemon.pid"
    fc.init(backend="ssh", **dict(ssh_config, ssh_host_retry=60))
    job = fc.Process(target=subprocess.call, daemon=True,
                     args=(["sh", "-c", f"setsid sleep 120 & echo $! > {pid_file}; sleep 600"],))
    try:
        job.start()
        data = job._popen.job.data
        deadline = time.monotonic() + 60
        while not (pid_file.exists() and pid_file.read_text().strip()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        job.kill()
        job.join(KILL_WAIT + 30)
        assert job.exitcode == -signal.SIGKILL
        assert data.kill_answered and data.host.down_until <= time.monotonic(), data.host.down_reason
        after = fc.Process(target=sleep_for, args=(0,))
        after.start()
        after.join(60)
        assert after.exitcode == 0
    finally:
        if pid_file.exists() and pid_file.read_text().strip():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        if job._popen is not None:
            job.kill()
            job.join(30)
        fc.init()
