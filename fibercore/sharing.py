"""One copy per machine of a large read-only object: ``table = fibercore.shared(noise)``.

The object is pickled once (protocol 5, its buffers out of band) into a file in
``/dev/shm`` of the creating process's machine, mode 0600. The handle pickles to a
name, a size and a random tag, so passing it (in ``initargs``, as an argument, through
a Queue) costs a few dozen bytes. ``handle.value`` in any process gives the object:

* on the **same machine**, the file is mapped: numpy arrays and other out-of-band
  buffers are views of that one copy, read-only (``handle.value`` of an ES noise table
  costs no memory per worker);
* **elsewhere** (a container, a pod, a Batch job, an SSH host: their own ``/dev/shm``),
  the bytes are read once from the creating process's synchronization service into a
  file of that machine's ``/dev/shm``, which other jobs there map in turn;
* in both, a process maps a segment once, however many times it receives the handle.

The file is removed when the creating process drops its last handle (a Pool holds
its ``initargs``), and at its exit; a process that mapped it keeps reading its
mapping. After SIGKILL of the creator, Python's resource tracker removes it, and
``fiber cleanup`` or the next program on the machine removes what is still left
(:func:`sweep`). A file found under the name is used only if this user owns it, no
one else may read or write it, and it starts with the handle's tag
(:func:`fibercore.shm.open_segment`); the creator serves reads from the descriptor it made
the segment with, and after :meth:`Shared.release` answers "released", never with the file
that may now be under the name.

Large numpy arrays in a Pool's ``initargs`` are shared this way without being asked
(:func:`share_large`), mapped copy-on-write: each worker sees a writable array, as
after ``fork``, and pages it writes become its own.
"""

from __future__ import annotations

import collections
import functools
import logging
import mmap
import os
import pickle
import struct
import threading
import time
import weakref
from typing import Any

import cloudpickle

from fibercore import shm
from fibercore.lifetime import at_process_end
from fibercore.sync.handles import Handle
from fibercore.sync.states import State
from fibercore.util import machine_identity

log = logging.getLogger("fibercore.sharing")

#: Where segments live, and their names' prefix (:mod:`fibercore.shm`).
SHM_DIR = shm.SHM_DIR
PREFIX = shm.PREFIX
#: The segment's layout: tag, pickle length, number of buffers; then (offset, length)
#: of each buffer; then the pickle; then the buffers, each at a multiple of ALIGN.
_HEAD = struct.Struct("<16sQQ")
_SPAN = struct.Struct("<QQ")
ALIGN = 64
#: Bytes per request when a process elsewhere reads a segment from its creator.
CHUNK = 8 << 20
#: Seconds a process waits for another one on its machine that is copying the same object.
COPY_WAIT = 120.0
#: Seconds between looks whether an incomplete copy still has a process making it (one that
#: was killed leaves a file no one will finish: it is removed).
STALE_AFTER = 2.0


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _pack(obj: Any) -> tuple[bytes, list[pickle.PickleBuffer], list[tuple[int, int]], int]:
    """Pickle ``obj``: the pickle, its out-of-band buffers, where each goes, and the total size."""
    buffers: list[pickle.PickleBuffer] = []
    data = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    pos = _align(_HEAD.size + _SPAN.size * len(buffers) + len(data))
    spans = []
    for buf in buffers:
        size = buf.raw().nbytes
        spans.append((pos, size))
        pos = _align(pos + size)
    return data, buffers, spans, max(pos, 1)


def _create(obj: Any) -> tuple[str, bytes, int, int]:
    """Write ``obj`` into a new segment: its name, tag, size, and a descriptor of it that the
    creator keeps to serve reads (never the name again: another user may plant a file there
    once it is removed)."""
    data, buffers, spans, size = _pack(obj)
    tag = os.urandom(16)
    name = shm.new_name("o")
    path = shm.segment_path(name)
    fd = shm.create_segment(name)
    try:
        _track(name)
        _reserve(fd, size, path)
        with mmap.mmap(fd, size) as mm:
            pos = _HEAD.size
            for span in spans:
                mm[pos:pos + _SPAN.size] = _SPAN.pack(*span)
                pos += _SPAN.size
            mm[pos:pos + len(data)] = data
            for (start, length), buf in zip(spans, buffers, strict=True):
                mm[start:start + length] = buf.raw()
            mm[:_HEAD.size] = _HEAD.pack(tag, len(data), len(spans))  # last: the segment is complete
    except BaseException:
        _unlink(name, shm.identity(fd))
        os.close(fd)
        raise
    return name, tag, size, fd


def _reserve(fd: int, size: int, path: str) -> None:
    """Give the segment its size, all of it allocated now: a tmpfs that is too small fails here,
    with the fix in the message, not with SIGBUS on a later write."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        free = 0
        try:
            st = os.statvfs(os.path.dirname(path))
            free = st.f_bavail * st.f_frsize
        except OSError:
            pass
        raise OSError(exc.errno, f"no room for a shared object of {size / 1e6:.1f} MB in {os.path.dirname(path)} "
                      f"({free / 1e6:.1f} MB free): make it larger (a container: --shm-size; the "
                      "docker backend: docker_shm_size)") from None


#: Segments this process registered with the resource tracker (each is unregistered once:
#: a second unregister makes the tracker print a KeyError at exit).
_tracked: set[str] = set()


def _track(name: str) -> None:
    """Let Python's resource tracker remove the segment if this process is killed."""
    try:
        from multiprocessing import resource_tracker

        resource_tracker.register("/" + name, "shared_memory")
        _tracked.add(name)
    except Exception:  # no tracker (an embedded interpreter): fiber cleanup removes it
        pass


def _unlink(name: str, made: tuple[int, int] | None = None) -> None:
    """Remove segment ``name`` if it is still the file made here (``made``), and let the
    resource tracker forget it."""
    shm.remove_segment(name, made)
    if name not in _tracked:
        return
    _tracked.discard(name)
    try:
        from multiprocessing import resource_tracker

        resource_tracker.unregister("/" + name, "shared_memory")
    except Exception:
        pass


#: Mappings of this process by segment name: one per segment, however many handles.
#: Weak: a mapping is unmapped when nothing built on it is left.
_maps: dict[tuple[str, bool], weakref.ref[mmap.mmap]] = {}
_maps_lock = threading.Lock()


#: The objects last built from segments in this process, newest last: ``handle.value`` of
#: an object whose parts are unpickled (a ``bytes``, a dict) builds it once, not per access,
#: while it is among the :data:`RECENT` most recently read (a process that reads a new object
#: every generation holds at most that many).
_recent: collections.OrderedDict[str, Any] = collections.OrderedDict()
RECENT = 4


def _forget_value(name: str) -> None:
    """Drop the object built from segment ``name`` (its creator released it or dropped its
    last handle)."""
    with _maps_lock:
        value = _recent.pop(name, None)
    del value  # freed outside the lock


def _unlink_and_forget(name: str, made: tuple[int, int] | None) -> None:
    _forget_value(name)
    _unlink(name, made)


def _forget_map(key: tuple[str, bool], _ref: Any) -> None:
    """A mapping was unmapped (nothing built on it was left): forget it."""
    _maps.pop(key, None)


def _open_checked(name: str, tag: bytes, size: int) -> int | None | bool:
    """A read-only descriptor of segment ``name`` when it is this object's; None when it is
    not there or not complete yet (its tag is written last); False when it is not ours
    (a link, another owner, access for others, too small): never used."""
    fd, why = shm.open_segment(name, tag, size)
    if fd is not None:
        return fd
    if why in ("missing", "tag"):
        return None
    log.warning("%s/%s is not the segment of this shared object (%s): not used", shm.SHM_DIR, name, why)
    return False


def _map_fd(fd: int, size: int, private: bool) -> mmap.mmap:
    if private:  # copy-on-write: writable, and a write stays in this process
        return mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)


def _load(mm: mmap.mmap, private: bool) -> Any:
    """The object stored in a mapped segment; its buffers are views of the mapping."""
    _tag, length, count = _HEAD.unpack_from(mm)
    view = memoryview(mm)
    if not private:
        view = view.toreadonly()
    spans = [_SPAN.unpack_from(mm, _HEAD.size + i * _SPAN.size) for i in range(count)]
    start = _HEAD.size + count * _SPAN.size
    buffers = [view[pos:pos + size] for pos, size in spans]
    return pickle.loads(view[start:start + length], buffers=buffers)


class SharedState(State):
    """The creating process's side, in its synchronization service: bytes of the segment for
    processes that cannot map it, read from the descriptor made at creation (never by name)."""

    kind = "shared object"

    def __init__(self, name: str, size: int, fd: int) -> None:
        self.name = name
        self.size = size
        self._fd: int | None = fd
        self._made = shm.identity(fd)
        self._closer = weakref.finalize(self, os.close, fd)
        #: Bytes and reads served to processes on other machines (one copy per machine).
        self.served = 0
        self.reads = 0

    def describe(self) -> str:
        return (f"{self.name}, {self.size:,} bytes, {self.served:,} served"
                + (", released" if self._fd is None else ""))

    def op_read(self, w: Any, offset: int, length: int) -> bytes:
        if self._fd is None:
            raise ReferenceError(f"the shared object {self.name} was released by its creator (Shared.release()): "
                                 "release it only once no process will read it again (a new Pool worker does)")
        offset = max(0, min(int(offset), self.size))
        data = os.pread(self._fd, max(0, min(int(length), CHUNK, self.size - offset)), offset)
        self.served += len(data)
        self.reads += 1
        return data

    def op_stats(self, w: Any) -> dict[str, int]:
        return {"size": self.size, "bytes_served": self.served, "reads": self.reads}

    def op_release(self, w: Any) -> None:
        """Remove the segment (if still the file made here) and stop serving it."""
        _unlink(self.name, self._made)
        if self._fd is not None:
            self._fd = None
            self._closer()


class Shared(Handle):
    """A read-only object kept once per machine; ``.value`` is the object.

    Made by :func:`shared`. Pickles to its name (a few dozen bytes): pass it to jobs in
    ``initargs``, as an argument or through a Queue. Keep it referenced in the creating
    process while other processes may still open it.
    """

    _state_kind = "shared object"
    _name: str
    _tag: bytes
    _size: int
    _machine: str
    _private: bool

    def __init__(self, obj: Any) -> None:
        self._name, self._tag, self._size, fd = _create(obj)
        self._machine = machine_identity()
        self._private = False
        state = SharedState(self._name, self._size, fd)
        self._create(state)
        weakref.finalize(self, _unlink_and_forget, self._name, state._made)

    @property
    def nbytes(self) -> int:
        """The segment's size: the object's pickle and buffers."""
        return self._size

    @property
    def value(self) -> Any:
        """The object, built on this machine's one copy (mapped once per process; built once
        per process while among the :data:`RECENT` objects it read last)."""
        if self._private:  # copy-on-write: a fresh view each time, as before (nothing to copy)
            return _load(self._mapping(), True)
        key = self._name
        with _maps_lock:
            if key in _recent:
                _recent.move_to_end(key)
                return _recent[key]
        obj = _load(self._mapping(), False)
        evicted = []
        with _maps_lock:
            _recent[key] = obj
            while len(_recent) > RECENT:
                evicted.append(_recent.popitem(last=False))
        del evicted  # freed here, outside the lock
        return obj

    def _mapping(self) -> mmap.mmap:
        key = (self._name, self._private)
        with _maps_lock:
            ref = _maps.get(key)
            mm = ref() if ref is not None else None
            if mm is not None:
                return mm
            mm = self._map_here() or self._copy_here()
            _maps[key] = weakref.ref(mm, functools.partial(_forget_map, key))
            return mm

    def _map_here(self) -> mmap.mmap | None:
        """The creator's segment, when this process shares its machine's ``/dev/shm``."""
        if not self._machine or self._machine != machine_identity():
            return None
        fd = _open_checked(self._name, self._tag, self._size)
        if fd is None or fd is False:
            if not self._remote():
                raise ReferenceError(f"the shared object's segment {shm.SHM_DIR}/{self._name} is gone (released)")
            return None
        try:
            return _map_fd(fd, self._size, self._private)
        finally:
            os.close(fd)

    def _copy_here(self) -> mmap.mmap:
        """A copy on this machine, read from the creator once for every process here: the first
        process to ask makes it, the others wait for it and map it."""
        name = f"{shm.COPY_PREFIX}{self._tag.hex()}"
        path = shm.segment_path(name)
        try:
            fd = shm.create_segment(name)
        except FileExistsError:
            found = self._wait_for_copy(name)
            if found is not None:
                return found
            return self._read_into(None)  # the copying process died: a copy of its own
        except OSError:  # no /dev/shm here: a copy in this process's memory
            return self._read_into(None)
        made = shm.identity(fd)
        try:
            _track(name)
            at_process_end(lambda: _unlink(name, made))
            _reserve(fd, self._size, path)
        except OSError:  # no room in this machine's /dev/shm: a copy in this process's memory
            _unlink(name, made)
            os.close(fd)
            return self._read_into(None)
        try:
            return self._read_into(fd)
        except BaseException:
            _unlink(name, made)
            raise
        finally:
            os.close(fd)

    def _wait_for_copy(self, name: str) -> mmap.mmap | None:
        deadline = time.monotonic() + COPY_WAIT
        path = shm.segment_path(name)
        look_again = time.monotonic() + STALE_AFTER
        while time.monotonic() < deadline:
            fd = _open_checked(name, self._tag, self._size)
            if fd is False:
                return None
            if fd is not None:
                try:
                    return _map_fd(fd, self._size, self._private)
                finally:
                    os.close(fd)
            if not os.path.exists(path):
                return None
            if time.monotonic() > look_again:  # still incomplete: is anyone making it?
                look_again = time.monotonic() + STALE_AFTER
                if path not in shm.in_use_by_me():  # its maker died (with its resource tracker)
                    shm.remove_segment(name)
                    return None
            time.sleep(0.01)
        return None

    def _read_into(self, fd: int | None) -> mmap.mmap:
        """Read the segment from its creator into ``fd`` (a file of this machine) or into
        anonymous memory; the tag goes in last, when the copy is complete."""
        mm = mmap.mmap(-1 if fd is None else fd, self._size)
        pos = 16
        while pos < self._size:
            chunk = self._call("read", pos, min(CHUNK, self._size - pos))
            if not chunk:
                raise ReferenceError("the shared object's creator no longer has it")
            mm[pos:pos + len(chunk)] = chunk
            pos += len(chunk)
        mm[:16] = self._tag
        if fd is None:
            return mm
        mm.close()
        return _map_fd(fd, self._size, self._private)

    def stats(self) -> dict[str, int]:
        """``size``, and ``bytes_served``/``reads``: what the creator sent to other machines
        (each machine reads the object once, whatever number of its processes use it)."""
        return dict(self._call("stats"))

    def release(self) -> None:
        """Remove the segment now (the creating process only); mappings stay readable."""
        if self._remote():
            raise ValueError("only the process that created a shared object can release it")
        _forget_value(self._name)
        self._call("release")

    # -- pickling -----------------------------------------------------------------------------
    def _extra(self) -> tuple[Any, ...]:
        return (self._name, self._tag, self._size, self._machine, self._private)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        self._name, self._tag, self._size, self._machine, self._private = extra

    def __reduce__(self) -> Any:
        from fibercore.runtime import credentials_for_child
        from fibercore.sync.handles import _rebuild

        # Not pinned: the segment goes with the creator's last handle, not at its exit.
        return (_rebuild, (type(self), self._address, self._oid, self._creator, self._extra(),
                           credentials_for_child()))

    def __repr__(self) -> str:
        return f"<fibercore.Shared {self._name} {self._size} bytes>"


_swept: list[int] = []


def shared(obj: Any) -> Shared:
    """Keep ``obj`` once on this machine, read-only, for every process to map: a handle whose
    ``.value`` is the object (numpy arrays in it are views of the one copy)."""
    if not _swept:  # the first in this program: what killed programs left goes first
        _swept.append(1)
        sweep()
    return Shared(obj)


class CopyOnWrite:
    """A large array of a Pool's ``initargs``, shared: unpickled, it is the array itself, a
    copy-on-write mapping of the one copy on the machine (writable, writes stay private)."""

    __slots__ = ("handle",)

    def __init__(self, handle: Shared) -> None:
        self.handle = handle

    def __reduce__(self) -> Any:
        return (_copy_on_write, (self.handle,))


def _copy_on_write(handle: Shared) -> Any:
    handle._private = True
    return handle.value


def large_array(value: Any, at_least: int) -> bool:
    """Whether ``value`` is a numpy array of ``at_least`` bytes or more without Python objects
    in it: what is shared without being asked (:func:`share_large`, and ``__main__`` globals)."""
    np = _numpy()
    return np is not None and type(value) is np.ndarray and value.nbytes >= at_least and not value.dtype.hasobject


def share_large(values: tuple[Any, ...], at_least: int) -> tuple[Any, ...]:
    """``values`` with each :func:`large_array` (at the top, or in a tuple, list or dict there)
    replaced by a :class:`CopyOnWrite` of a new shared segment."""
    if _numpy() is None:
        return values

    def swap(value: Any, depth: int) -> Any:
        if large_array(value, at_least):
            return CopyOnWrite(shared(value))
        if depth >= 2:
            return value
        if type(value) in (tuple, list):
            return type(value)(swap(v, depth + 1) for v in value)
        if type(value) is dict:
            return {k: swap(v, depth + 1) for k, v in value.items()}
        return value

    return tuple(swap(v, 0) for v in values)


def _numpy() -> Any:
    import sys

    return sys.modules.get("numpy")  # arrays exist only if the program imported numpy


def sweep() -> list[str]:
    """Remove this user's segments that nothing will use again (:func:`fibercore.shm.sweep`:
    shared objects, boards and ``Value``s whose maker is gone, copies no process maps)."""
    return shm.sweep()


__all__ = ["CopyOnWrite", "Shared", "SharedState", "share_large", "shared", "sweep"]
