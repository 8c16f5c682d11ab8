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

The directory is ``$FIBER_STATUS_DIR``, else ``$XDG_RUNTIME_DIR/fibercore``, else
``/tmp/fibercore-<uid>``: made with mode 0700, and refused when another user owns it or it is
a symbolic link (a directory in /tmp could be made first by someone else).
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path
from typing import Any

#: A watch file older than this (seconds) means nobody is looking any more.
WATCH_FRESH = 3.0


def status_dir(create: bool = True) -> Path:
    """This user's status directory (checked: ours, not a link, not open to others)."""
    base = os.environ.get("FIBER_STATUS_DIR")
    if base:
        path = Path(base)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = Path(os.environ["XDG_RUNTIME_DIR"]) / "fibercore"
    else:
        path = Path("/tmp") / f"fibercore-{os.getuid()}"
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except FileExistsError:
            pass
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PermissionError(
            f"{path} is not a directory of this user's (a link, or owned by uid {info.st_uid}): "
            "remove it, or point FIBER_STATUS_DIR at a directory of your own")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


def _write(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, separators=(",", ":"), default=str)
    os.replace(partial, path)


def _read(path: Path) -> dict[str, Any] | None:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def announce(session: str, info: dict[str, Any]) -> None:
    """Say that this session's master runs here (its first job started)."""
    _write(status_dir() / f"{session}.master", info)


def withdraw(session: str) -> None:
    """The master ends: its files go."""
    folder = status_dir(create=False)
    for suffix in (".master", ".status", ".watch", ".bell"):
        try:
            os.unlink(folder / f"{session}{suffix}")
        except OSError:
            pass


def watch(session: str) -> None:
    """``fiber top`` looks at ``session``: the master writes its status while this stays fresh."""
    folder = status_dir()
    path = folder / f"{session}.watch"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    os.close(fd)
    os.utime(path)
    ring(folder / f"{session}.bell")


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
        fd = os.open(path, os.O_RDONLY)  # blocks until a writer opens it
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
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
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
            withdraw(session)
            continue
        info["session"] = session
        found.append(info)
    return found


__all__ = ["announce", "make_bell", "read_status", "ring", "sessions", "status_dir", "wait_for_bell", "watch",
           "watched", "withdraw", "write_status"]
