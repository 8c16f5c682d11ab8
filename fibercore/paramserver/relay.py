"""Large parameters to the workers on *another* machine: each version crosses the network once
per machine, not once per worker.

A pull from another machine is answered with a :class:`HostRef` (the version and the
parameters' layout), not the arrays. The worker looks for that version in its machine's
*host board*, a ``/dev/shm`` segment of ``SLOTS`` slots shared by the server's workers there
(the same seqlock slots as :mod:`fibercore.paramserver.board`, a slot's version stored plus
one so that an empty slot is no version). If the version is there, it is copied out. If not,
the worker takes the slot's lock (``lockf`` on the slot's bytes, released by the kernel if
the worker dies), looks again (another worker may have just written it), and else fetches
the version from the server once (``fetch``), writes it into the slot and releases the lock:
the other workers of the machine, waiting for the lock, then find it there.

The segment is made and opened only through :mod:`fibercore.shm` (``O_EXCL``, mode 0600,
owner, mode, size and tag checked); its name is a hash of the server's secret tag and the
layout, its content starts with the tag. A file under the name that is not ours, a machine
without ``/dev/shm`` or without room: the worker fetches over its connection, as without
a relay. The process that made the segment removes it at its end (the resource tracker
after SIGKILL; ``fiber cleanup`` removes copies nothing maps).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import logging
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from fibercore import shm
from fibercore.lifetime import at_process_end
from fibercore.paramserver.board import SLOTS, Layout, fits, layout_of, read_slot, write_slot
from fibercore.sharing import _reserve, _track, _unlink

log = logging.getLogger("fibercore.paramserver")

_TAG = 16
#: Seconds a worker waits for another one of its machine that is fetching the same version.
LOCK_WAIT = 120.0

Params = dict[str, np.ndarray]


class HostRef:
    """What a pull from another machine gets: the version, and how to find it on the host board."""

    __slots__ = ("tag", "version", "layout", "slot_size")

    def __init__(self, tag: bytes, version: int, layout: Layout, slot_size: int) -> None:
        self.tag, self.version, self.layout, self.slot_size = tag, version, layout, slot_size

    def __reduce__(self) -> Any:
        return (HostRef, (self.tag, self.version, self.layout, self.slot_size))

    @property
    def name(self) -> str:
        """The host board's name: the server's tag and the layout, hashed (the tag stays secret)."""
        digest = hashlib.sha256(self.tag + repr(self.layout).encode()).hexdigest()[:32]
        return f"{shm.COPY_PREFIX}ps-{digest}"

    @property
    def size(self) -> int:
        return _TAG + SLOTS * self.slot_size

    def read(self, fetch: Callable[[int], Params | None]) -> Params | None:
        """The version's parameters: from the host board, or fetched once for the machine with
        ``fetch(version)`` and written there. None when the server no longer has the version
        (the caller asks for the latest)."""
        board = _board(self)
        if board is None:
            return fetch(self.version)
        return board.read_or_fetch(self, fetch)


class HostBoard:
    """This process's view of its machine's host board: the mapping, and a descriptor for the slots' locks."""

    def __init__(self, fd: int, mm: mmap.mmap) -> None:
        self.fd = fd
        self.mm = mm
        self.locks = [threading.Lock() for _ in range(SLOTS)]  # lockf does not exclude this process's threads

    def read_or_fetch(self, ref: HostRef, fetch: Callable[[int], Params | None]) -> Params | None:
        slot = ref.version % SLOTS
        base = _TAG + slot * ref.slot_size
        got = read_slot(self.mm, base, ref.slot_size, ref.layout, ref.version + 1)
        if got is not None:
            return got
        with self.locks[slot]:
            try:
                locked = _lock_range(self.fd, base, ref.slot_size)
            except OSError as exc:  # ENOLCK...: this worker's own copy
                log.info("parameter server: no lock on the host board (%s)", exc)
                locked = False
            if not locked:
                return fetch(ref.version)  # (also when the machine's fetcher is stuck)
            try:
                got = read_slot(self.mm, base, ref.slot_size, ref.layout, ref.version + 1)
                if got is not None:
                    return got
                params = fetch(ref.version)
                if params is not None and fits(params, ref.layout):
                    write_slot(self.mm, base, ref.slot_size, ref.layout, params, ref.version + 1)
                return params
            finally:
                fcntl.lockf(self.fd, fcntl.LOCK_UN, ref.slot_size, base)


def _lock_range(fd: int, start: int, length: int) -> bool:
    """Take the record lock on ``length`` bytes at ``start``; False after :data:`LOCK_WAIT`."""
    deadline = time.monotonic() + LOCK_WAIT
    pause = 0.001
    while True:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, length, start)
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 0.02)


_boards: dict[str, HostBoard | None] = {}
_boards_lock = threading.Lock()
#: Boards that could not be had for a moment (being made, no room), by name: when to try again.
_retry: dict[str, float] = {}
RETRY_AFTER = 5.0


def _board(ref: HostRef) -> HostBoard | None:
    """This machine's host board for ``ref`` (made here if no process of the machine made it
    yet); None when it cannot be used (the worker then fetches over its connection): for
    good when the file there is not ours, for :data:`RETRY_AFTER` seconds otherwise."""
    name = ref.name
    with _boards_lock:
        if name in _boards:
            return _boards[name]
        if time.monotonic() < _retry.get(name, 0.0):
            return None
        board, final = _open_or_make(name, ref.tag, ref.size)
        if board is not None or final:
            _boards[name] = board
            _retry.pop(name, None)
        else:
            _retry[name] = time.monotonic() + RETRY_AFTER
        return board


def _map(fd: int, size: int) -> HostBoard | None:
    """A board on ``fd`` (closed if it cannot be mapped)."""
    try:
        return HostBoard(fd, mmap.mmap(fd, size))
    except OSError as exc:
        os.close(fd)
        log.info("parameter server: the host board cannot be mapped (%s)", exc)
        return None


def _open_or_make(name: str, tag: bytes, size: int) -> tuple[HostBoard | None, bool]:
    """(the board or None, whether that answer is final: a file there that is not ours)."""
    deadline = time.monotonic() + 10.0
    while True:
        try:
            fd = shm.create_segment(name)
        except FileExistsError:
            found, why = shm.open_segment(name, tag, size, writable=True)
            if found is not None:
                return _map(found, size), False
            if why not in ("missing", "tag"):
                log.warning("%s/%s is not this machine's parameter board (%s): not used", shm.SHM_DIR, name, why)
                return None, True
            if time.monotonic() >= deadline:  # still being made (or left half-made): later
                return None, False
            if why == "tag":  # its maker is sizing it or writing the tag: a moment
                time.sleep(0.005)
            continue  # "missing": removed meanwhile, make it
        except OSError as exc:  # no /dev/shm here
            log.info("parameter server: no host board (%s); each worker fetches its own", exc)
            return None, False
        made = shm.identity(fd)
        try:
            _track(name)
            at_process_end(functools.partial(_unlink, name, made))
            _reserve(fd, size, shm.segment_path(name))
            mm = mmap.mmap(fd, size)
        except OSError as exc:  # no room in this machine's /dev/shm
            _unlink(name, made)
            os.close(fd)
            log.info("parameter server: no host board (%s); each worker fetches its own", exc)
            return None, False
        mm[:_TAG] = tag  # last: the board is ready for the others
        return HostBoard(fd, mm), False


def _forked() -> None:
    """In a forked child: no lock held by a thread of the parent, no board of its (the child
    opens its own; record locks are not inherited anyway)."""
    global _boards_lock
    _boards_lock = threading.Lock()
    for board in _boards.values():
        if board is not None:
            try:
                os.close(board.fd)
            except OSError:
                pass
    _boards.clear()
    _retry.clear()


os.register_at_fork(after_in_child=_forked)


__all__ = ["HostBoard", "HostRef", "layout_of"]
