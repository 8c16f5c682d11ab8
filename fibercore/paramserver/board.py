"""Large parameters to the workers on the server's machine: written once per version into a
``/dev/shm`` segment (the *board*), read there by each worker, instead of one copy per pull
through the server's connection.

Layout: a tag (16 bytes), then ``SLOTS`` slots. A slot is a sequence number and a version
(u64 each), then every parameter's bytes at fixed offsets (names, dtypes and shapes are the
board's *layout*, sent once with the reference). Writing version v to slot ``v % SLOTS`` is a
seqlock: the sequence is made odd, the arrays written, the sequence made even. A reader copies
the arrays out and checks that the sequence was even and unchanged and the version is the one
it was told; otherwise (overwritten meanwhile: a worker ``SLOTS`` versions behind) it asks the
server for the parameters over the connection, as without a board.

The segment is named, opened and removed through :mod:`fibercore.shm` (mode 0600, no link
followed, owner, mode, size and tag checked before use; removed at the server's end while it
is still the file made there, by the resource tracker after SIGKILL, or by ``fiber cleanup``).
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import weakref
from typing import Any

import numpy as np

from fibercore import shm
from fibercore.sharing import _reserve, _track, _unlink
from fibercore.util import machine_identity

#: Versions kept on the board: a reader may be this many versions late before it must ask again.
SLOTS = 4
_SEQ = struct.Struct("<QQ")  # sequence, version
_TAG = 16
_ALIGN = 64

Layout = tuple[tuple[str, str, tuple[int, ...], int], ...]  # (name, dtype, shape, offset in the slot)


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def layout_of(params: dict[str, np.ndarray]) -> tuple[Layout, int]:
    """Where each parameter goes in a slot (after the slot's sequence and version), and the slot's size."""
    offset = _SEQ.size
    layout = []
    for name, value in params.items():
        offset = _align(offset)
        layout.append((name, value.dtype.str, tuple(value.shape), offset))
        offset += value.nbytes
    return tuple(layout), _align(offset)


def fits(params: dict[str, np.ndarray], layout: Layout) -> bool:
    """Whether ``params`` have ``layout`` (an ``apply`` may change a dtype or shape)."""
    return len(params) == len(layout) and all(
        name in params and params[name].dtype.str == dtype and params[name].shape == shape
        for name, dtype, shape, _ in layout)


def write_slot(mm: Any, base: int, slot_size: int, layout: Layout, params: dict[str, np.ndarray],
               stored: int) -> None:
    """Write ``params`` into the slot at ``base`` as the seqlock says: the sequence odd while
    writing (one a writer that died left odd is taken as even), even again with ``stored``."""
    seq = _SEQ.unpack_from(mm, base)[0]
    seq += seq % 2
    _SEQ.pack_into(mm, base, seq + 1, stored)  # odd: being written
    view = np.frombuffer(mm, dtype=np.uint8, count=slot_size, offset=base)
    for name, _dtype, _shape, offset in layout:
        value = np.ascontiguousarray(params[name])
        view[offset:offset + value.nbytes] = value.view(np.uint8).reshape(-1)
    _SEQ.pack_into(mm, base, seq + 2, stored)  # even: complete


def read_slot(mm: Any, base: int, slot_size: int, layout: Layout, stored: int) -> dict[str, np.ndarray] | None:
    """The arrays of the slot at ``base``, copied out, when it holds ``stored`` complete and was
    not written again while copying; None otherwise."""
    seq, found = _SEQ.unpack_from(mm, base)
    if seq % 2 or found != stored:
        return None
    view = np.frombuffer(mm, dtype=np.uint8, count=slot_size, offset=base)
    out = {}
    for name, dtype, shape, offset in layout:
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        out[name] = view[offset:offset + count * dt.itemsize].view(dt).reshape(shape).copy()
    if _SEQ.unpack_from(mm, base) != (seq, found):  # written again while copying
        return None
    return out


class Board:
    """The server's side: the segment, and the last version written to each slot."""

    def __init__(self, params: dict[str, np.ndarray]) -> None:
        self.layout, self.slot_size = layout_of(params)
        self.size = _TAG + SLOTS * self.slot_size
        self.tag = os.urandom(_TAG)
        self.machine = machine_identity()
        self.name = shm.new_name("ps")
        fd = shm.create_segment(self.name)
        made = shm.identity(fd)
        try:
            _track(self.name)
            _reserve(fd, self.size, shm.segment_path(self.name))
            self.mm = mmap.mmap(fd, self.size)
        except BaseException:
            _unlink(self.name, made)
            raise
        finally:
            os.close(fd)
        self.mm[:_TAG] = self.tag
        self.written = [-1] * SLOTS
        # once: at close, collection or exit; only while the name is still the file made here
        self._remove = weakref.finalize(self, _unlink, self.name, made)

    def fits(self, params: dict[str, np.ndarray]) -> bool:
        """Whether ``params`` have the board's layout (an ``apply`` may change a dtype or shape)."""
        return fits(params, self.layout)

    def publish(self, version: int, params: dict[str, np.ndarray]) -> int:
        """Write ``version`` (once); its slot."""
        slot = version % SLOTS
        if self.written[slot] == version:
            return slot
        write_slot(self.mm, _TAG + slot * self.slot_size, self.slot_size, self.layout, params, version)
        self.written[slot] = version
        return slot

    def ref(self, slot: int, version: int) -> BoardRef:
        return BoardRef(self.name, self.tag, self.size, self.slot_size, slot, version, self.layout)

    def close(self) -> None:
        self._remove()


class BoardRef:
    """What a pull on the server's machine gets: where to read its version."""

    __slots__ = ("name", "tag", "size", "slot_size", "slot", "version", "layout")

    def __init__(self, name: str, tag: bytes, size: int, slot_size: int, slot: int, version: int,
                 layout: Layout) -> None:
        self.name, self.tag, self.size, self.slot_size = name, tag, size, slot_size
        self.slot, self.version, self.layout = slot, version, layout

    def __reduce__(self) -> Any:
        return (BoardRef, (self.name, self.tag, self.size, self.slot_size, self.slot, self.version, self.layout))

    def read(self) -> dict[str, np.ndarray] | None:
        """The version's parameters, copied out of the board; None when it was overwritten
        meanwhile (or the board cannot be used here: ask the server instead)."""
        mm = _mapping(self.name, self.tag, self.size)
        if mm is None:
            return None
        return read_slot(mm, _TAG + self.slot * self.slot_size, self.slot_size, self.layout, self.version)


_maps: dict[tuple[str, bytes], mmap.mmap | None] = {}
_maps_lock = threading.Lock()


def _mapping(name: str, tag: bytes, size: int) -> mmap.mmap | None:
    """This process's read-only mapping of a board (made once); None when the file is not
    there or not the board it should be (another owner, others may read it, another tag)."""
    with _maps_lock:
        if (name, tag) in _maps:
            return _maps[name, tag]
        mm = None
        fd, _why = shm.open_segment(name, tag, size)
        if fd is not None:
            try:
                mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
            except OSError:
                mm = None
            finally:
                os.close(fd)
        if mm is not None:  # a board not there (yet, or any more) is looked for again next time
            _maps[name, tag] = mm
        return mm


def here() -> str:
    """This machine's identity, sent with a pull so the server knows whether the board is readable."""
    return machine_identity()


__all__ = ["SLOTS", "Board", "BoardRef", "fits", "here", "layout_of", "read_slot", "write_slot"]
