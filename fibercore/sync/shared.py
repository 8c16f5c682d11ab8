"""``Value``, ``Array``, ``RawValue`` and ``RawArray`` (``multiprocessing.sharedctypes``).

The ctypes object is kept in a shared-memory segment of the creating process's machine,
and served by that process's sync service:

* a process on the **same machine** (the master, local jobs) maps the segment: accesses
  are memory accesses, as with multiprocessing, and ``get_obj()`` is a real ctypes object
  (``numpy.frombuffer(a.get_obj())`` works: gymnasium's shared-memory vector envs);
* a process **elsewhere** (a pod, a Batch job, a container with its own ``/dev/shm``)
  cannot map it: every access (``v.value``, ``a[i]``, ``a[2:7] = ...``) is one request to
  the service, which reads and writes the same memory.

C semantics either way (an ``'i'`` wraps at 32 bits). With a lock (the default, a new
RLock), each access runs under it, as multiprocessing's ``Synchronized`` does (remotely,
lock and access are one request), so ``with v.get_lock(): v.value += 1`` is atomic.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from multiprocessing import resource_tracker, shared_memory
from typing import Any

from fibercore import shm
from fibercore.sync.handles import Handle
from fibercore.sync.primitives import Lock, RLock, WithLock, _depth, _held
from fibercore.sync.service import Ref
from fibercore.sync.states import DataState, ctype_of
from fibercore.util import machine_identity

log = logging.getLogger("fibercore.sync")


class _Segment(shared_memory.SharedMemory):
    """A shared-memory segment this process made, that ctypes objects map until it ends."""

    def __del__(self) -> None:
        try:
            self.close()
        except BufferError:
            pass  # ctypes objects still map it: the process's end unmaps it


class _Mapped:
    """A segment another process of this machine made, opened through
    :func:`fibercore.shm.open_segment` and mapped read-write while ctypes objects use it."""

    def __init__(self, fd: int) -> None:
        self.size = os.fstat(fd).st_size
        self._mm = mmap.mmap(fd, self.size)
        self.buf = memoryview(self._mm)

    def close(self) -> None:
        self.buf.release()
        self._mm.close()


#: Segments this process created (unlinked at exit) or mapped (kept while mapped).
_segments: dict[str, _Segment | _Mapped] = {}


#: Bytes in front of the object in its segment: a random tag the handle carries, checked
#: before a process maps the segment (a segment planted under the name is not used).
HEADER = 16


def _allocate(ctype: Any) -> tuple[Any, str, bytes]:
    """A zeroed ``ctype`` object in a new shared-memory segment (mode 0600), its name and tag.
    The name says which process made it, so ``fiber cleanup`` can remove it after a SIGKILL."""
    segment = _Segment(create=True, size=HEADER + max(1, ctypes.sizeof(ctype)), name=shm.new_name("v"))
    made = shm.identity(segment._fd)  # type: ignore[attr-defined]
    tag = os.urandom(HEADER)
    segment.buf[:HEADER] = tag  # type: ignore[index]
    _segments[segment.name] = segment
    weakref.finalize(segment, _unlink, segment.name, made)  # at exit: the creating process owns it
    _made[segment.name] = made
    return ctype.from_buffer(segment.buf, HEADER), segment.name, tag


#: (device, inode) of each segment this process made: removed only while the name is still it.
_made: dict[str, tuple[int, int]] = {}


def _release_segment(address: str, oid: int, name: str) -> None:
    """The creating process dropped its last handle: the segment goes, unless the object was
    sent to another process (then it stays until this process ends)."""
    from fibercore.sync.handles import _local

    svc = _local(address)
    if svc is None or oid not in svc.pinned:
        _segments.pop(name, None)
        _unlink(name, _made.get(name))


def _unlink(name: str, made: tuple[int, int] | None) -> None:
    """Remove segment ``name`` if it is still the file this process made; the resource
    tracker forgets it."""
    if made is None:
        return
    _made.pop(name, None)
    shm.remove_segment(name, made)
    try:
        resource_tracker.unregister("/" + name, "shared_memory")
    except Exception:
        pass


def _map(name: str, ctype: Any, tag: bytes, machine: str) -> Any | None:
    """The object in segment ``name`` if this machine has that very segment (None: use the
    service): same machine, and the file passes :func:`fibercore.shm.open_segment`'s checks
    (a regular file of this user, no access for others, the handle's tag at its start)."""
    segment = _segments.get(name)
    if segment is None:
        if not machine or machine != machine_identity():
            return None
        fd, why = shm.open_segment(name, tag, HEADER + ctypes.sizeof(ctype), writable=True)
        if fd is None:
            if why != "missing":
                log.warning("shared memory %s/%s is not the segment of this object (%s): not mapped; every "
                            "access goes to the creating process instead", shm.SHM_DIR, name, why)
            return None
        try:
            segment = _Mapped(fd)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        _segments[name] = segment
    if segment.size < HEADER + ctypes.sizeof(ctype):
        return None
    return ctype.from_buffer(segment.buf, HEADER)


def _attribute(name: str, doc: str) -> property:
    """A ctypes attribute of the shared object (``value``, ``raw``), read and written here
    or through the service."""
    return property(lambda self: self._get(name), lambda self, new: self._set(name, new), doc=doc)


class _Data(Handle):
    """The part RawValue and RawArray share: where the object is, here or in the service."""

    _local: Any  # the ctypes object when this process maps the segment, else None
    _ctype: Any
    _item: Any  # the ctypes type of the value, or of an array's items
    _length: int | None  # an array's length
    _segment: str
    _tag: bytes  # what the segment starts with
    _machine: str  # where the segment is (util.machine_identity)

    def _setup(self, item: Any, length: int | None, init: Any) -> None:
        self._item, self._length = item, length
        self._ctype = item if length is None else item * length
        self._local, self._segment, self._tag = _allocate(self._ctype)
        self._machine = machine_identity()
        init(self._local)
        self._create(DataState(self._local))
        weakref.finalize(self, _release_segment, self._address, self._oid, self._segment).atexit = False

    def _extra(self) -> tuple[Any, ...]:
        return (self._item, self._length, self._segment, self._tag, self._machine)  # types are made, not pickled

    def _restore(self, extra: tuple[Any, ...]) -> None:
        self._item, self._length, self._segment, self._tag, self._machine = extra
        self._ctype = self._item if self._length is None else self._item * self._length
        self._local = _map(self._segment, self._ctype, self._tag, self._machine)

    def _lock_ref(self) -> tuple[Any, ...]:
        return ()

    def _get(self, attr: str) -> Any:
        if self._local is not None:
            return getattr(self._local, attr)
        return self._call("get", attr, *self._lock_ref())

    def _set(self, attr: str, value: Any) -> None:
        if self._local is not None:
            setattr(self._local, attr, value)
        else:
            self._call("set", attr, value, *self._lock_ref())


class RawValue(_Data):
    """A shared ctypes value without a lock."""

    def __init__(self, typecode_or_type: Any, *args: Any) -> None:
        ctype = ctype_of(typecode_or_type)

        def init(obj: Any) -> None:
            if args:
                obj.value = ctype(*args).value

        self._setup(ctype, None, init)

    value = _attribute("value", "The value.")

    def __repr__(self) -> str:
        if self._local is not None:
            return repr(self._local)
        return str(self._call("repr"))


class RawArray(_Data):
    """A shared ctypes array without a lock."""

    def __init__(self, typecode_or_type: Any, size_or_initializer: Any) -> None:
        item = ctype_of(typecode_or_type)
        if isinstance(size_or_initializer, int):
            values: list[Any] | None = None
            size = size_or_initializer
        else:
            values = list(size_or_initializer)
            size = len(values)

        def init(obj: Any) -> None:
            if values:
                obj[:] = values

        self._setup(item, size, init)

    def __len__(self) -> int:
        return int(self._ctype._length_)

    def __getitem__(self, key: Any) -> Any:
        if self._local is not None:
            return self._local[key]
        return self._call("getitem", key, *self._lock_ref())

    def __setitem__(self, key: Any, value: Any) -> None:
        if self._local is not None:
            self._local[key] = value
            return
        if isinstance(key, slice) and not isinstance(value, (bytes, bytearray)):
            value = list(value)
        self._call("setitem", key, value, *self._lock_ref())

    def __iter__(self) -> Iterator[Any]:
        return iter(self[:])  # one request for the whole array

    value = _attribute("value", "A char array's bytes up to the first NUL (as ctypes' c_char arrays).")
    raw = _attribute("raw", "A char array's bytes, all of them.")

    def __repr__(self) -> str:
        return f"<{self._ctype.__name__} {list(self)!r}>"


class _Synchronized(WithLock):
    """multiprocessing's ``Synchronized`` wrapper: the object with its lock; every access
    runs under the lock (remotely: in the same single request)."""

    _lock: Lock | RLock
    _local: Any
    _remote: Callable[[], bool]  # from the _Data it is mixed with
    _call: Callable[..., Any]
    _raw_class: type[_Data]

    def _lock_ref(self) -> tuple[Any, ...]:
        return (Ref(self._lock._oid),)

    def get_lock(self) -> Lock | RLock:
        return self._lock

    def get_obj(self) -> Any:
        """The ctypes object itself when this process maps it (buffer protocol: numpy),
        else a raw handle to it."""
        if self._local is not None:
            return self._local
        raw = self._raw_class.__new__(self._raw_class)
        raw._address, raw._oid, raw._creator = self._address, self._oid, self._creator  # type: ignore[attr-defined]
        raw._ctype, raw._item, raw._length = self._ctype, self._item, self._length  # type: ignore[attr-defined]
        raw._segment, raw._local = self._segment, None  # type: ignore[attr-defined]
        raw._keep = self  # type: ignore[attr-defined]  # the object lives while the view does
        return raw

    def _mapped_here(self) -> bool:
        """Whether to touch the memory here: it is mapped, and taking the lock costs no
        request (this process's own service, or this thread holds the lock already).
        Otherwise one request does lock and access together (cheaper than lock, access,
        release)."""
        if self._local is None:
            return False
        if not self._remote():
            return True
        key = (self._lock._address, self._lock._oid)
        if isinstance(self._lock, RLock):
            return _depth.get((*key, threading.get_ident()), 0) > 0
        return _held.get(key, 0) > 0

    def _get(self, attr: str) -> Any:
        if self._mapped_here():
            with self._lock:
                return getattr(self._local, attr)
        return self._call("get", attr, *self._lock_ref())

    def _set(self, attr: str, value: Any) -> None:
        if self._mapped_here():
            with self._lock:
                setattr(self._local, attr, value)
        else:
            self._call("set", attr, value, *self._lock_ref())


def _lock_for(lock: Any, where: Handle) -> Lock | RLock:
    """The lock of a synchronized object: a new RLock for True/None, or the caller's,
    which must live in the same process's service."""
    if lock is None or lock is True:
        return RLock()
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{lock!r} has no attribute 'acquire': lock must be True, False, None or a Lock")
    if not isinstance(lock, (Lock, RLock)) or lock._address != where._address:
        raise ValueError("the lock of a shared Value or Array must be a fibercore Lock or RLock created "
                         "by the same process")
    return lock


class SynchronizedValue(_Synchronized, RawValue):
    """``Value(typecode, value)``: a shared ctypes value and its lock."""

    _raw_class = RawValue

    def __init__(self, typecode_or_type: Any, *args: Any, lock: Any = True) -> None:
        self._home = getattr(lock, "_address", None)  # a lock of its own: the value lives beside it
        RawValue.__init__(self, typecode_or_type, *args)
        self._lock = _lock_for(lock, self)

    def _extra(self) -> tuple[Any, ...]:
        return (*RawValue._extra(self), self._lock)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        *raw, self._lock = extra
        RawValue._restore(self, tuple(raw))

    def __repr__(self) -> str:
        return f"<Synchronized wrapper for {RawValue.__repr__(self)}>"


class SynchronizedArray(_Synchronized, RawArray):
    """``Array(typecode, size_or_sequence)``: a shared ctypes array and its lock."""

    _raw_class = RawArray

    def __init__(self, typecode_or_type: Any, size_or_initializer: Any, lock: Any = True) -> None:
        self._home = getattr(lock, "_address", None)  # a lock of its own: the value lives beside it
        RawArray.__init__(self, typecode_or_type, size_or_initializer)
        self._lock = _lock_for(lock, self)

    def _extra(self) -> tuple[Any, ...]:
        return (*RawArray._extra(self), self._lock)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        *raw, self._lock = extra
        RawArray._restore(self, tuple(raw))

    def __getitem__(self, key: Any) -> Any:
        if self._mapped_here():
            with self._lock:
                return self._local[key]
        return self._call("getitem", key, *self._lock_ref())

    def __setitem__(self, key: Any, value: Any) -> None:
        if self._mapped_here():
            with self._lock:
                self._local[key] = value
            return
        if isinstance(key, slice) and not isinstance(value, (bytes, bytearray)):
            value = list(value)
        self._call("setitem", key, value, *self._lock_ref())

    def __repr__(self) -> str:
        return f"<SynchronizedArray wrapper for {RawArray.__repr__(self)}>"


def Value(typecode_or_type: Any, *args: Any, lock: Any = True, ctx: Any = None) -> Any:
    """A shared ctypes value: with ``lock`` True (a new RLock) or a Lock/RLock, a
    synchronized wrapper (``get_lock()``, ``get_obj()``); with ``lock=False`` a raw value."""
    if lock is False:
        return RawValue(typecode_or_type, *args)
    return SynchronizedValue(typecode_or_type, *args, lock=lock)


def Array(typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True, ctx: Any = None) -> Any:
    """A shared ctypes array of a size or from a sequence; ``lock`` as for :func:`Value`."""
    if lock is False:
        return RawArray(typecode_or_type, size_or_initializer)
    return SynchronizedArray(typecode_or_type, size_or_initializer, lock=lock)


__all__ = ["Array", "RawArray", "RawValue", "Value"]
