"""A second, unprivileged local user for the attacks in tests/test_security.py.

The test (root) creates the account, and each attack runs in a child forked from the test
process that drops to that user (groups, gid, uid) before it does anything: it uses what
it attacks (fibercore's own framing and handshake code, already imported), but has no
secret and none of the test's rights. The account is removed when the test ends.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  # the attacker cannot read the stdlib once it dropped root
import json
import os
import pwd
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any


class LocalUser:
    """An account the test made; :meth:`run` executes a function as it."""

    def __init__(self) -> None:
        self.name = f"fcatk{secrets.token_hex(3)}"
        subprocess.run(["useradd", "--no-create-home", "--no-user-group", "--shell", "/usr/sbin/nologin",
                        self.name], check=True, capture_output=True)
        entry = pwd.getpwnam(self.name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self._children: list[int] = []

    def spawn(self, fn: Callable[..., Any], *args: Any) -> tuple[int, int]:
        """Start ``fn(*args)`` as this user in a forked child; (pid, read end of its result)."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the attacker: no way back to root from here
            code = 0
            try:
                os.close(r)
                os.setgroups([])
                os.setgid(self.gid)
                os.setuid(self.uid)
                result = fn(*args)
                os.write(w, json.dumps(result).encode())
            except BaseException as exc:  # reported to the test, never raised into pytest's copy
                os.write(w, json.dumps({"attacker_error": repr(exc)}).encode())
                code = 1
            finally:
                os._exit(code)
        os.close(w)
        self._children.append(pid)
        return pid, r

    def result(self, child: tuple[int, int], timeout: float = 120) -> Any:
        """Wait for a spawned attack to end (its pipe closes when it exits); what it returned."""
        import select

        pid, r = child
        deadline = time.monotonic() + timeout
        chunks = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._reap(pid, kill=True)
                os.close(r)
                raise AssertionError(f"the attacker {pid} did not end within {timeout} s")
            poller = select.poll()  # not select(): a long run holds descriptors above 1023
            poller.register(r, select.POLLIN)
            if not poller.poll(int(min(left, 0.5) * 1000)):
                continue
            data = os.read(r, 65536)
            if not data:
                break
            chunks.append(data)
        os.close(r)
        self._reap(pid)
        out = json.loads(b"".join(chunks) or b"null")
        if isinstance(out, dict) and "attacker_error" in out:
            raise AssertionError(f"the attack itself failed: {out['attacker_error']}")
        return out

    def _reap(self, pid: int, kill: bool = False) -> None:
        """Collect the child (fibercore's own reaper may have collected it already)."""
        if pid in self._children:
            self._children.remove(pid)
        try:
            if kill:
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float = 120) -> Any:
        return self.result(self.spawn(fn, *args), timeout)

    def remove(self) -> None:
        for pid in list(self._children):  # stopped by their pid, never by name
            self._reap(pid, kill=True)
        subprocess.run(["userdel", self.name], capture_output=True)
