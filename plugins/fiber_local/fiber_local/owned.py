"""This user's processes, found in ``/proc`` and held so that a signal reaches only them.

``fiber ps``, ``stop``, ``cleanup``, ``logs`` and ``cp`` find a session's jobs by the variables
in ``/proc/<pid>/environ``; any user writes those for a process of their own, so a process
counts only when every uid in its ``/proc/<pid>/status`` (real, effective, saved, filesystem)
is the caller's. Between that check and a signal the process may end and its pid be reused:
each found process is held by a pidfd (Linux 5.3+), opened *before* the checks and confirmed
after them, and signalled through it; where there is none, the process's start time is
checked again just before ``kill``.
"""

from __future__ import annotations

import os
import select
import signal
from types import TracebackType


def _uids(pid: int) -> tuple[int, ...] | None:
    """The real, effective, saved and filesystem uids of ``pid`` (None: gone or unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"Uid:"):
                    return tuple(int(field) for field in line.split()[1:])
    except (OSError, ValueError):
        return None
    return None


def is_mine(pid: int) -> bool:
    """Whether every uid of process ``pid`` is this process's effective uid."""
    uids = _uids(pid)
    return bool(uids) and all(uid == os.geteuid() for uid in uids or ())


def environ(pid: int) -> dict[bytes, bytes] | None:
    """The environment ``pid`` started with (or has written since), None if unreadable."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return dict(item.split(b"=", 1) for item in fh.read().split(b"\0") if b"=" in item)
    except OSError:
        return None


def _start(pid: int) -> str:
    """``pid``'s start time ("" when it does not run): with the pid, which process it is."""
    from fibercore.util import process_start

    return process_start(pid)


class OwnProcess:
    """A process of this user, held: :meth:`signal` reaches it and never a process that took
    its pid after it ended. Close it (or use it as a context manager) when done."""

    def __init__(self, pid: int, env: dict[bytes, bytes], pidfd: int | None, start: str) -> None:
        self.pid = pid
        self.env = env
        self._pidfd = pidfd
        self._start = start

    def alive(self) -> bool:
        """Whether it still runs (not ended; an unreaped zombie counts as ended)."""
        if self._pidfd is not None:
            poller = select.poll()
            poller.register(self._pidfd, select.POLLIN)  # a pidfd reads ready once its process ended
            return not poller.poll(0)
        from fiber_local.forking import process_alive

        return bool(self._start) and process_alive(self.pid) and _start(self.pid) == self._start

    def signal(self, sig: int) -> bool:
        """Send ``sig`` to this process (only); False if it is gone."""
        try:
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            elif self._start and _start(self.pid) == self._start:  # no pidfd: the narrowest check there is
                os.kill(self.pid, sig)
            else:
                return False
            return True
        except OSError:
            return False

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def __enter__(self) -> OwnProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _pidfd_open(pid: int) -> int | None:
    """A pidfd of ``pid``; None where the kernel or Python has none. Raises OSError when gone."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return int(opener(pid))
    except OSError as exc:
        import errno

        if exc.errno in (errno.ENOSYS, errno.EPERM, errno.EINVAL):  # no pidfds here (old kernel, seccomp)
            return None
        raise


def own_process(pid: int) -> OwnProcess | None:
    """``pid`` held, if it is a live process of this user whose environment can be read; else None.

    The pidfd is opened first; the uids and environment read after it are that process's
    as long as it still runs once they are read (a pid is not reused before its process is reaped).
    """
    if pid == os.getpid():
        return None
    try:
        pidfd = _pidfd_open(pid)
    except OSError:
        return None
    start = "" if pidfd is not None else _start(pid)
    held = OwnProcess(pid, {}, pidfd, start)
    env = environ(pid) if is_mine(pid) else None
    if env is None or not held.alive():
        held.close()
        return None
    held.env = env
    return held


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def hold_child(pid: int, parent: int) -> OwnProcess | None:
    """``pid`` held if it is still a running child of ``parent`` (which has not reaped it, so
    the pid is not reused yet); None otherwise."""
    try:
        pidfd = _pidfd_open(pid)
    except OSError:
        return None
    held = OwnProcess(pid, {}, pidfd, "" if pidfd is not None else _start(pid))
    if _parent(pid) != parent or not held.alive():  # read after the pidfd was opened: about it
        held.close()
        return None
    return held


def scan(want: bytes) -> list[OwnProcess]:
    """This user's live processes whose environment holds the variable ``want``, held (the
    caller closes them)."""
    found = []
    me = os.geteuid()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != me:  # cheap first sieve; own_process checks every uid
                continue
        except OSError:
            continue
        env = environ(int(entry))
        if env is None or want not in env:
            continue
        held = own_process(int(entry))
        if held is not None and want in held.env:
            found.append(held)
    return found
