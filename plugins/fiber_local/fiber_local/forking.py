"""The master's side of fiber-local's template process (:mod:`fiber_local.template`): start
it, ask it to fork jobs, and follow those jobs (they are its children, not the master's).

Also the two ``/proc`` readings the backend makes of any local process (alive, its name).
"""

from __future__ import annotations

import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

#: Set in the template process's environment (and so in every job it forks, whose
#: ``/proc/<pid>/environ`` is the template's): such a job's name is in its ``comm``.
TEMPLATE_ENV = "FIBERCORE_LOCAL_TEMPLATE"
#: The template's own ``comm`` (a job it forks names itself at once).
TEMPLATE_COMM = "fiber-template"
#: Seconds the template may take to import fibercore and report ready, and to answer a request.
TEMPLATE_TIMEOUT = 30.0


class Template:
    """The master's side of its template process (:mod:`fiber_local.template`): asks it to
    fork jobs, and learns their pids and exit statuses from it (they are its children)."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = ()) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "fiber_local.template", str(theirs.fileno()), ",".join(preload)],
                env=env, stdin=subprocess.DEVNULL, close_fds=True, pass_fds=(theirs.fileno(),))
        finally:
            theirs.close()
        self._sock.settimeout(TEMPLATE_TIMEOUT)
        try:
            ready = self._sock.recv(4096)
        except OSError:
            ready = b""
        if not ready:
            self.close()
            raise OSError("the local template process did not start (see its output above)")
        self._sock.settimeout(None)
        self._cv = threading.Condition()
        self._next = 0
        self._replies: dict[int, tuple[Any, ...]] = {}
        self.exits: dict[int, int] = {}
        self.started: set[int] = set()
        self.alive = True
        threading.Thread(target=self._read, name="fiber-local-template", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            message = pickle.loads(data)  # from our own child, over a pair of sockets only we hold
            with self._cv:
                if message[0] == "exit":
                    self.exits[message[1]] = message[2]
                else:
                    self._replies[message[1]] = message
                self._cv.notify_all()
        with self._cv:
            self.alive = False
            self._cv.notify_all()
        try:
            self.popen.wait(5.0)  # reaped: no zombie of it is left
        except subprocess.TimeoutExpired:
            pass

    def fork(self, env: dict[str, str], cwd: str | None, secret: str, name: str, fds: list[int]) -> int:
        """Start one job with ``fds`` (its stdout and stderr) as its output: its pid."""
        with self._cv:
            self._next += 1
            ident = self._next
        request = {"id": ident, "env": env, "cwd": cwd, "secret": secret, "name": name}
        socket.send_fds(self._sock, [pickle.dumps(request)], fds)
        deadline = time.monotonic() + TEMPLATE_TIMEOUT
        with self._cv:
            while ident not in self._replies:
                remaining = deadline - time.monotonic()
                if not self.alive or remaining <= 0:
                    raise OSError("the local template process did not answer")
                self._cv.wait(remaining)
            reply = self._replies.pop(ident)
        if reply[0] != "started":
            raise OSError(reply[2])
        self.started.add(int(reply[2]))
        return int(reply[2])

    @property
    def busy(self) -> bool:
        """Whether a job it forked may still run."""
        with self._cv:
            return any(pid not in self.exits for pid in self.started)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        """``pid``'s returncode once it ended (within ``timeout``), else None."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while pid not in self.exits:
                if not self.alive and not process_alive(pid):
                    # The template is gone (its jobs went to init): the end is seen, its status lost.
                    return self.exits.setdefault(pid, -signal.SIGKILL)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                step = 1.0 if self.alive else 0.05
                self._cv.wait(step if remaining is None else min(remaining, step))
            return self.exits[pid]

    @property
    def usable(self) -> bool:
        return self.alive and self.popen.poll() is None

    def close(self, shutdown: bool = True) -> None:
        """The template exits when its end reads EOF. ``shutdown`` first: a close alone neither
        wakes this side's reading thread nor ends the connection while that thread holds it.
        Never in a forked copy of the master (``shutdown=False``): it would end the parent's
        connection too."""
        if shutdown:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self._sock.close()
        except OSError:
            pass


class Forked:
    """A job forked by the template: the part of Popen's API the hooks use."""

    def __init__(self, template: Template, pid: int) -> None:
        self._template = template
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self._template.wait(self.pid, 0)

    def poll(self) -> int | None:
        return self._template.wait(self.pid, 0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._template.wait(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(["fibercore.worker", str(self.pid)], timeout or 0)
        return code

    def send_signal(self, sig: int) -> None:
        """Signal the job, never a process that took its pid: the template reaps a job before
        the master hears it ended, so the pid is held (pidfd) and checked to be still the
        template's child (or, the template gone, a process of this user forked from one)."""
        from fiber_local import owned

        if self.poll() is not None:
            return
        held = owned.hold_child(self.pid, self._template.popen.pid)
        if held is None and self._template.popen.poll() is not None:  # its jobs went to init
            held = owned.own_process(self.pid)
            if held is not None and TEMPLATE_ENV.encode() not in held.env:
                held.close()
                held = None
        if held is not None:
            with held:
                held.signal(sig)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def process_name(pid: int) -> str | None:
    """The name a forked job gave itself (its environment is its template's)."""
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip() or None
    except OSError:
        return None
