"""fiber-ssh's launcher (the fixed program each ssh session runs on a host), run here as a
plain process: what a job leaves in the host's ``/dev/shm`` goes when the job ends."""

from __future__ import annotations

import json
import mmap
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fiber_ssh.remote import LAUNCHER

#: The job: makes a copy in /dev/shm as a shared() object's reader does (O_EXCL, 0600), keeps
#: it mapped in itself and in a child of its group (as a resource tracker would live on),
#: says so, then waits to be ended.
JOB = r"""
import mmap, os, sys, time
fd = os.open("/dev/shm/" + sys.argv[1], os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
os.ftruncate(fd, 4096)
m = mmap.mmap(fd, 4096)
os.close(fd)
if os.fork() == 0:
    time.sleep(600)
    os._exit(0)
print("ready", flush=True)
time.sleep(600)
"""


def _records(stream):
    while True:
        head = stream.read(5)
        if len(head) < 5:
            return
        kind, size = head[:1], struct.unpack(">I", head[1:])[0]
        yield kind, stream.read(size)


def _wait_until(predicate, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.02)


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="needs Linux /dev/shm")
@pytest.mark.parametrize("ending", ["15", "9", "eof", "gone"])
def test_what_a_job_left_in_dev_shm_goes_when_it_ends_and_nothing_else(ending: str) -> None:
    """A job ended by SIGTERM, SIGKILL, the end of its session's input (the master gone) or of
    the whole session (sshd dropped it: nothing can be reported) leaves its shared() copy
    behind, its resource tracker killed with its group: the launcher removes it once the group
    is gone, after reporting the exit code where it can (the session is not held for it). A copy
    another process still maps stays."""
    tag = os.urandom(8).hex()
    left, kept = f"fcs-copy-{tag}", f"fcs-copy-{tag}-kept"
    kept_path = Path("/dev/shm", kept)
    fd = os.open(kept_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    os.ftruncate(fd, 4096)
    holding = mmap.mmap(fd, 4096)  # mapped here, outside the job's group
    os.close(fd)
    spec = {"env": {}, "jid": f"test-{tag}", "name": "launcher-test", "secret": "s" * 32,
            "argv": [sys.executable, "-c", JOB, left]}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert launcher.stdin is not None and launcher.stdout is not None
        launcher.stdin.write(json.dumps(spec).encode() + b"\n")
        launcher.stdin.flush()
        records = _records(launcher.stdout)
        kind, pid = next(records)
        assert kind == b"P"
        said = b""
        while said != b"ready\n":  # the job's output, in as many records as its reads gave
            kind, data = next(records)
            assert kind == b"O" and b"ready\n".startswith(said + data), (kind, said + data)
            said += data
        assert Path("/dev/shm", left).exists()
        if ending == "gone":  # both streams closed: the launcher can tell nobody
            launcher.stdout.close()
            launcher.stdin.close()
        elif ending == "eof":
            launcher.stdin.close()
        else:
            launcher.stdin.write(ending.encode() + b"\n")
            launcher.stdin.flush()
        if ending != "gone":  # a signal is answered (K), then the exit code, then the end of the session
            said = [(kind, data) for kind, data in records]
            assert said[-1][0] == b"X", said
            assert said[:-1] == ([(b"K", ending.encode())] if ending.isdigit() else []), said
        assert launcher.wait(30) == 0
        _wait_until(lambda: not Path("/proc", pid.decode()).exists(), 60, "the job outlived its session")
        _wait_until(lambda: not Path("/dev/shm", left).exists(), 60, f"/dev/shm/{left} was left behind")
        assert kept_path.exists()  # still mapped by this process: not touched
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        holding.close()
        kept_path.unlink()
        Path("/dev/shm", left).unlink(missing_ok=True)
