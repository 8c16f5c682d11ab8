"""Where a running master and ``fiber top`` meet on one machine: a directory of small files.

For each session whose master runs here:

* ``<session>.master``: written once when the master starts its first job (its pid, program,
  backend, start time), removed at its exit; ``fiber top`` lists these.
* ``<session>.watch``: touched by ``fiber top`` about once a second while it shows the session.
  While it is fresh the master looks at its time once a second (one ``stat``), samples its
  objects and writes...
* ``<session>.status``: the latest snapshot (JSON), replaced whole (written beside, renamed).
* ``<session>.bell``: a FIFO the master's observing thread waits to be opened while nobody
  looks (no wake-up at all when idle); ``fiber top`` opens it when it touches the watch file.
* ``<session>.logs-wanted``: touched by ``fiber logs`` before it rings the bell (its time is
  the request; nothing in it is read); the master answers requests newer than its last with
* ``<session>.logs``: the recent output of all its jobs as their backend keeps it (the local
  backend: the last 64 KiB of each), with the time of the newest request it answers (JSON);
  several ``fiber logs`` at once share an answer.

The directory is ``$FIBER_STATUS_DIR``, else ``$XDG_RUNTIME_DIR/fibercore``, else
``/tmp/fibercore-<uid>``: made with mode 0700. One that is a link, not a directory, owned by
another user or writable by others, or on a way another user could change (a directory of
theirs, or one they can write that is not sticky, above it), is refused
(:class:`StatusDirError`, naming the fix) and never chmodded: it may be a shared directory
such as /tmp. Files in it are written beside and renamed, never through a link. When the default name in /tmp was
made first by another user, the directory is ``~/.cache/fibercore/status-<host>`` instead
(a home directory is not a place another user can create names in).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
from pathlib import Path
from typing import Any

from fibercore.errors import FiberError
from fibercore.util import others_can_change

#: A watch file older than this (seconds) means nobody is looking any more.
WATCH_FRESH = 3.0


class StatusDirError(PermissionError, FiberError):
    """The status directory cannot be used safely; the message names it and the fix."""


def _refusal(path: Path, info: os.stat_result) -> str | None:
    """Why ``path`` (lstat ``info``) cannot be this user's status directory (None: it can)."""
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    if info.st_uid != os.getuid():
        return f"it is owned by uid {info.st_uid}"
    if info.st_mode & 0o022:
        return f"others can write in it (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _checked(path: Path, create: bool, fix: str) -> Path:
    """``path`` made (0700) when asked and missing, then checked: never chmodded. Nothing is
    made on a way another user could change."""
    why = others_can_change(str(path.parent))
    if why is not None:
        raise StatusDirError(f"the status directory {path} is refused: {why}: {fix}")
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:  # a link or a file under that name: said below
            pass
        except OSError as exc:
            raise StatusDirError(f"the status directory {path} cannot be made ({exc.strerror}): {fix}") from None
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    why = _refusal(path, info) or others_can_change(str(path.parent))
    if why is not None:
        raise StatusDirError(f"the status directory {path} is refused: {why}: {fix}")
    return path


def _fallback() -> Path:
    """This user's status directory when the name in /tmp was taken by another user."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "fibercore" / f"status-{socket.gethostname()}"


def status_dir(create: bool = True) -> Path:
    """This user's status directory (checked: a directory of this user's that nobody else can write)."""
    base = os.environ.get("FIBER_STATUS_DIR")
    if base:
        return _checked(Path(base), create, "point FIBER_STATUS_DIR at a directory of your own that only you "
                                            "can write (mkdir -m 700 DIR)")
    if os.environ.get("XDG_RUNTIME_DIR"):
        return _checked(Path(os.environ["XDG_RUNTIME_DIR"]) / "fibercore", create,
                        "remove it, or set FIBER_STATUS_DIR to a directory of your own (mkdir -m 700 DIR)")
    fix = "set FIBER_STATUS_DIR to a directory of your own (mkdir -m 700 DIR)"
    default, fallback = Path("/tmp") / f"fibercore-{os.getuid()}", _fallback()
    try:
        info: os.stat_result | None = os.lstat(default)
    except FileNotFoundError:
        info = None
    if info is None and not _ours(fallback):
        try:
            return _checked(default, create, fix)
        except StatusDirError:  # made by someone else between the lstat and the mkdir
            pass
    elif info is not None and _refusal(default, info) is None:
        return default
    # Another user made /tmp/fibercore-<uid> first (or a link there): a name under the home
    # directory cannot be taken that way. fiber top takes the same way to it (and keeps to it
    # while it exists, should the name in /tmp be freed meanwhile).
    return _checked(fallback, create, f"{default} is taken by another user: {fix}")


def _ours(path: Path) -> bool:
    try:
        return _refusal(path, os.lstat(path)) is None
    except OSError:
        return False


def _write(path: Path, data: dict[str, Any]) -> None:
    """Replace ``path`` whole: written beside it (a new file: no link followed), then renamed."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(partial, flags, 0o600)
    except FileExistsError:  # left by a process of this pid before (or planted): made anew
        os.unlink(partial)
        fd = os.open(partial, flags, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, separators=(",", ":"), default=str)
    os.replace(partial, path)


#: The largest status file read (a snapshot, a logs answer): anything bigger is not ours.
_READ_MAX = 16 << 20


def _read(path: Path) -> dict[str, Any] | None:
    """A JSON object written by :func:`_write`; None for anything else (missing, not a regular
    file, a link, too big, not JSON, nested past the parser's depth)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _READ_MAX:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = json.loads(fh.read(_READ_MAX + 1))
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    return data if isinstance(data, dict) else None


def announce(session: str, info: dict[str, Any], folder: Path | None = None) -> None:
    """Say that this session's master runs here (its first job started)."""
    _write((folder or status_dir()) / f"{session}.master", info)


def withdraw(session: str, folder: Path | None = None) -> None:
    """The master ends: its files go."""
    if folder is None:
        try:
            folder = status_dir(create=False)
        except OSError:
            return
    for suffix in (".master", ".status", ".watch", ".bell", ".logs-wanted", ".logs"):
        try:
            os.unlink(folder / f"{session}{suffix}")
        except OSError:
            pass


def _touch_and_ring(session: str, suffix: str) -> float:
    """Set the time of ``<session><suffix>`` (made 0600 when missing, no link followed), then
    wake the master; returns that time."""
    folder = status_dir()
    fd = os.open(folder / f"{session}{suffix}", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                 0o600)
    try:
        os.utime(fd)
        when = os.fstat(fd).st_mtime
    finally:
        os.close(fd)
    ring(folder / f"{session}.bell")
    return when


def watch(session: str) -> None:
    """``fiber top`` looks at ``session``: the master writes its status while this stays fresh."""
    _touch_and_ring(session, ".watch")


def make_bell(session: str, folder: Path) -> Path | None:
    """The FIFO the master waits on while nobody looks (None where FIFOs cannot be made)."""
    path = folder / f"{session}.bell"
    try:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.mkfifo(path, 0o600)
    except (OSError, AttributeError):
        return None
    return path


def wait_for_bell(path: Path) -> None:
    """Sleep until someone opens the bell (:func:`ring`), or a second when it is gone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)  # blocks until a writer opens it
    except OSError:
        time.sleep(1.0)
        return
    try:
        os.read(fd, 64)
    finally:
        os.close(fd)


def ring(path: Path) -> None:
    """Wake a master waiting on its bell (nothing happens when none waits)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:  # ENXIO: no reader waits (the master is sampling already, or gone)
        return
    try:
        os.write(fd, b"!")
    except OSError:
        pass
    finally:
        os.close(fd)


def watched(session: str, folder: Path) -> bool:
    """Whether someone looked at ``session`` within the last few seconds (one ``stat``)."""
    try:
        return time.time() - os.stat(folder / f"{session}.watch").st_mtime < WATCH_FRESH
    except OSError:
        return False


def write_status(session: str, snapshot: dict[str, Any], folder: Path) -> None:
    _write(folder / f"{session}.status", snapshot)


def read_status(session: str) -> dict[str, Any] | None:
    """The latest snapshot the master of ``session`` wrote, or None."""
    return _read(status_dir() / f"{session}.status")


def want_logs(session: str) -> float:
    """``fiber logs`` asks the master of ``session`` for its jobs' recent output and wakes it;
    returns the request's time: any answer to a request made then or later will do."""
    return _touch_and_ring(session, ".logs-wanted")


def logs_wanted(session: str, folder: Path, answered: float) -> float | None:
    """The time of a request for logs newer than ``answered``, or None (one ``stat``)."""
    try:
        asked = os.stat(folder / f"{session}.logs-wanted").st_mtime
    except OSError:
        return None
    return asked if asked > answered else None


def write_logs(session: str, asked: float, jobs: list[dict[str, Any]], folder: Path) -> None:
    """The master's answer: every job's recent output (jid, name, text each), for the
    requests made up to ``asked``."""
    _write(folder / f"{session}.logs", {"asked": asked, "jobs": jobs})


def read_logs(session: str, asked: float, alive: int, timeout: float) -> list[dict[str, Any]] | None:
    """The master's answer to a request made at ``asked`` (or later), waited for up to
    ``timeout`` seconds while its process ``alive`` runs: None when none came. The bell is
    rung again at each look: a master busy answering another request missed the first."""
    folder = status_dir()
    path, bell = folder / f"{session}.logs", folder / f"{session}.bell"
    deadline = time.monotonic() + timeout
    while True:
        answer = _read(path)
        if (answer is not None and isinstance(answer.get("asked"), float) and answer["asked"] >= asked
                and isinstance(answer.get("jobs"), list)):
            return [job for job in answer["jobs"] if isinstance(job, dict)]
        if time.monotonic() >= deadline or not _alive(alive):
            return None
        time.sleep(0.05)
        ring(bell)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sessions() -> list[dict[str, Any]]:
    """The masters running on this machine for this user (files of dead ones are removed)."""
    folder = status_dir()
    found = []
    for path in sorted(folder.glob("*.master")):
        info = _read(path)
        session = path.name[: -len(".master")]
        if info is None or not isinstance(info.get("pid"), int) or not _alive(info["pid"]):
            withdraw(session, folder)
            continue
        info["session"] = session
        found.append(info)
    return found


__all__ = ["StatusDirError", "announce", "logs_wanted", "make_bell", "read_logs", "read_status", "ring", "sessions",
           "status_dir", "wait_for_bell", "want_logs", "watch", "watched", "withdraw", "write_logs", "write_status"]
