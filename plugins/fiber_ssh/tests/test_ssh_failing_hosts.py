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


def test_a_job_no_host_can_start_fails_with_the_ssh_error_and_the_fix(ssh_config: dict[str, Any]) -> None:
    """Every host refuses (nothing listens): after two sessions per host the start fails with
    ssh's own words and what to check, instead of waiting out start_timeout (it did: the
    count of tries was a set of host names, so the job was tried again and again)."""
    fc.init(backend="ssh", **dict(ssh_config, ssh_hosts="127.0.0.2:1,127.0.0.3:1", ssh_host_retry=1))
    try:
        job = fc.Process(target=sleep_for, args=(0,))
        with pytest.raises(fc.ProcessError) as failed:
            job.start()
    finally:
        fc.init()
    text = str(failed.value)
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
