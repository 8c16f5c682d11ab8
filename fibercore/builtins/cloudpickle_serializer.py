"""Built-in serializer: cloudpickle with pickle protocol 5 out-of-band buffers.

cloudpickle pickles functions and classes defined in ``__main__`` or interactively
by value, so a worker never has to re-import the master's main script. Plain data
of the most common types takes the C pickler directly (cloudpickle costs ~3 µs more
per call). Large contiguous buffers (numpy arrays, PickleBuffer) travel out of band:
they are not copied into the pickle stream.

Functions of the master's ``__main__`` share one namespace in each receiving
process (:data:`MAIN_NAMESPACE`), as they share the re-imported main module in a
child of multiprocessing's spawn. Plain cloudpickle gives every ``dumps`` call a
fresh globals dict, so a global set by a Pool initializer was invisible to the
tasks, and a module-level cache was rebuilt on every ``map``. A global that a
received function refers to takes the sender's value the first time it arrives,
and again whenever the sender has bound the name to another object since it last
sent it (``theta = theta + step`` in the master between two maps reaches the
workers). Otherwise the receiver keeps its own value: what an initializer or a
cache stored there, as in a spawned child. Like multiprocessing, changes the
sender makes *inside* an object (``theta += step`` on an array) do not travel:
pass such values as arguments. Under that rule a large numpy global (config
``share_arrays_from``) travels as a handle to one shared copy on the machine
(:mod:`fibercore.sharing`), made once per array.
"""

from __future__ import annotations

import collections
import io
import itertools
import linecache
import os
import pickle
import sys
import threading
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle

from fibercore.builtins import numpy_pickling
from fibercore.hookspecs import hookimpl

_PLAIN = frozenset({bytes, str, int, float, bool, type(None), bytearray, complex})
#: Plain types whose size does not matter: a flat tuple of them is plain data at one look.
_SCALARS = _PLAIN - {bytes}
_OOB_MIN = 4096  # smaller buffers are cheaper in band
#: bytes of this size or more travel out of band too: the C pickler copies them into the
#: stream (a map of 20 items of 10 MB held 140 MB of such copies in the master). Only
#: immutable bytes: a bytearray is copied when it is pickled, as multiprocessing does, so a
#: message or a task that leaves later carries what it held then (and the caller may resize it).
_OOB_BYTES = 1 << 16
#: Objects a plain-data walk looks at before it gives up (and cloudpickle takes the object).
_WALK_BUDGET = 256


#: numpy's scalar types met so far (``np.float32``, ``np.bool_`` ...): plain, known at one look.
_NUMPY_SCALARS: set[type] = set()


#: Added to :func:`_plain_kind`'s answer when the data holds numpy objects.
_NUMPY_INSIDE = 4


def _plain_data(obj: Any) -> int:
    """0 unless ``obj`` is data the C pickler writes exactly as cloudpickle would: the plain
    types, tuples, lists and dicts of them, and numpy arrays and scalars without Python
    objects inside (an RL step's observation, a small task's arguments and result).

    Nothing in such an object is a function, a class of ``__main__`` or a fibercore handle
    whose ``__reduce__`` has effects (a manager proxy's reference count), so pickling it
    once with the C pickler is both safe and final. The walk stops after
    :data:`_WALK_BUDGET` objects: a big structure goes to cloudpickle, whose cost per byte is
    the same and whose cost per call no longer matters. Plain data gives 1, or 2 when it
    holds an array big enough to travel out of band (:data:`_OOB_MIN`), or 3 when it holds a
    bytes of :data:`_OOB_BYTES` or more (see :func:`_big_bytes_out_of_band`).
    """
    return _plain_kind(obj) & 3


def _plain_kind(obj: Any) -> int:
    """:func:`_plain_data`'s answer, plus :data:`_NUMPY_INSIDE` when the data holds a numpy
    array or scalar (then small data is pickled by :mod:`~fibercore.builtins.numpy_pickling`)."""
    kind = type(obj)
    odd = None
    if (kind is tuple or kind is list) and len(obj) <= 16:
        # A flat tuple (an RL step's (obs, reward, terminated, truncated), a task's arguments):
        # its types looked at in one pass, its arrays alone one by one.
        odd = set(map(type, obj)) - _SCALARS
        if not odd:
            return 1
        if odd <= _NUMPY_SCALARS:  # (an action sent as ("step", np.int64(1)))
            return 1 | _NUMPY_INSIDE
    np = sys.modules.get("numpy")
    ndarray = generic = None
    if np is not None:
        ndarray, generic = np.ndarray, np.generic
    if odd is not None and ndarray is not None and len(odd) == 1 and ndarray in odd:
        found = 1 | _NUMPY_INSIDE
        for item in obj:
            if type(item) is ndarray:
                if item.dtype.hasobject:
                    return 0
                if item.nbytes >= _OOB_MIN:
                    found = 2 | _NUMPY_INSIDE
        return found
    # The walk: containers go on the stack; each one's items are looked at in a loop of their
    # own, where a plain scalar (most of an RL message's items) costs one look-up.
    budget = _WALK_BUDGET - 1  # the object itself; each container's items as it is taken
    stack = [obj]
    found = 1
    big_bytes = False
    numpy = 0
    while stack:
        container = stack.pop()
        kind = type(container)
        if kind is tuple or kind is list:
            budget -= len(container)
            items = container
        elif kind is dict:
            budget -= 2 * len(container)
            items = (*container, *container.values()) if budget >= 0 else ()
        else:  # the object itself is not a container
            items = (container,)
        if budget < 0:
            return 0
        for item in items:
            kind = type(item)
            if kind in _SCALARS:
                continue
            if kind is tuple or kind is list or kind is dict:
                stack.append(item)
            elif kind is bytes:
                if len(item) >= _OOB_BYTES:
                    big_bytes = True
            elif kind is ndarray:
                if item.dtype.hasobject:
                    return 0
                if item.nbytes >= _OOB_MIN:
                    found = 2
                numpy = _NUMPY_INSIDE
            elif kind in _NUMPY_SCALARS:
                numpy = _NUMPY_INSIDE
            elif generic is not None and isinstance(item, generic) and kind.__module__ == "numpy":
                numpy = _NUMPY_INSIDE
                # A numpy scalar (there is no object scalar: numpy gives the object itself), but a
                # structured one (np.void, np.record: a row) may hold objects in its fields: looked
                # at each time, never remembered.
                if item.dtype.kind == "V":  # np.void and np.record
                    if item.dtype.hasobject:
                        return 0
                else:
                    _NUMPY_SCALARS.add(kind)
            else:
                return 0
    return (3 if big_bytes else found) | numpy

class _OutOfBand:
    """A large bytes, pickled as a buffer out of band and rebuilt as bytes on the other side
    (one copy there, as from a pickle stream; none here: bytes cannot change)."""

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return bytes, (pickle.PickleBuffer(self.value),)


def _big_bytes_out_of_band(obj: Any, memo: dict[int, Any] | None = None) -> Any:
    """Plain data (:func:`_plain_data` said 3) with each large bytes wrapped in
    :class:`_OutOfBand`: the containers around them are rebuilt, once each (an object met
    twice is one object after unpickling, as before)."""
    if memo is None:
        memo = {}
    kind = type(obj)
    if kind is bytes:
        if len(obj) < _OOB_BYTES:
            return obj
    elif kind is not list and kind is not tuple and kind is not dict:
        return obj
    done = memo.get(id(obj))
    if done is not None:
        return done
    new: Any
    if kind is list:
        new = [_big_bytes_out_of_band(item, memo) for item in obj]
    elif kind is tuple:
        new = tuple(_big_bytes_out_of_band(item, memo) for item in obj)
    elif kind is dict:
        new = {key: _big_bytes_out_of_band(value, memo) for key, value in obj.items()}
    else:
        new = _OutOfBand(obj)
    memo[id(obj)] = new
    return new


#: The namespace that functions of a sender's ``__main__`` get in this process.
MAIN_NAMESPACE: dict[str, Any] = {"__name__": "__mp_main__", "__builtins__": __builtins__}
_received: dict[str, tuple[str, int]] = {}  # name -> the sender's version of it we last took
_main_lock = threading.Lock()
# The sending side: each global's current object and its version (a strong reference,
# so an id is never reused while it is the recorded one).
_SENDER = os.urandom(8).hex()
_sent: dict[str, tuple[Any, int]] = {}
_versions = itertools.count(1)


def _versions_of(names: Any, namespace: dict[str, Any]) -> dict[str, tuple[str, int]]:
    """This process's version of each global in ``names`` (new when the name was rebound)."""
    out = {}
    with _main_lock:
        for name in names:
            if name not in namespace:
                continue
            value = namespace[name]
            known = _sent.get(name)
            if known is None or known[0] is not value:
                known = _sent[name] = (value, next(_versions))
            out[name] = (_SENDER, known[1])
    return out


def _is_main_globals(namespace: dict[str, Any]) -> bool:
    main = sys.modules.get("__main__")
    return namespace is MAIN_NAMESPACE or (main is not None and namespace is vars(main))


def _make_main_function(code: types.CodeType, name: str | None, argdefs: Any, closure: Any) -> types.FunctionType:
    """Unpickling: a function of the sender's ``__main__``, in this process's shared namespace."""
    return types.FunctionType(code, MAIN_NAMESPACE, name, argdefs, closure)


def _main_function_setstate(func: types.FunctionType, state: Any) -> None:
    """cloudpickle's ``_function_setstate``, merging globals by the rule in the module docstring."""
    state, slotstate, versions = state
    func.__dict__.update(state)
    carried = slotstate.pop("__globals__")
    closure = slotstate.pop("__closure__")
    slotstate.pop("_cloudpickle_submodules", None)
    with _main_lock:
        for key, value in carried.items():
            version = versions.get(key)
            if key not in MAIN_NAMESPACE or _received.get(key) != version:
                MAIN_NAMESPACE[key] = value
                _received[key] = version
    if closure is not None:
        for i, cell in enumerate(closure):
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            func.__closure__[i].cell_contents = value  # type: ignore[index]
    for key, value in slotstate.items():
        setattr(func, key, value)


_cloudpickle_code_reduce = cloudpickle.Pickler.dispatch_table[types.CodeType]
_MAX_SOURCE_LINES = 2000  # a function longer than this travels without its source


def _source_of(code: types.CodeType) -> tuple[int, tuple[str, ...]] | None:
    """The lines of ``code``'s own source (first line number, lines), from this process's
    linecache. Nested functions, lambdas and comprehensions are code objects of their own,
    reduced (with their lines) as constants of this one."""
    last = max((line for _start, _end, line in code.co_lines() if line is not None),
               default=code.co_firstlineno)
    if last - code.co_firstlineno >= _MAX_SOURCE_LINES:
        return None
    lines = linecache.getlines(code.co_filename)
    if len(lines) < last:
        return None
    return code.co_firstlineno, tuple(lines[code.co_firstlineno - 1:last])


def _code_reduce(code: types.CodeType) -> Any:
    """cloudpickle's code reducer, keeping the real ``co_filename`` (and, for a function's own
    code, its source lines): cloudpickle 3.1.3 writes ``"<dynamic-code>"`` there, and a worker's
    traceback then names no file and shows no line. The source goes along so that the line
    shows even where the file is not (a container, another host)."""
    reduced = _cloudpickle_code_reduce(code)
    return _make_code, (reduced, code.co_filename, _source_of(code))


def _make_code(reduced: Any, filename: str, source: tuple[int, tuple[str, ...]] | None) -> types.CodeType:
    """Unpickling: the code object with its sender's file name, and its lines known to linecache."""
    make, args = reduced
    code = make(*args)
    if code.co_filename != filename:
        code = code.replace(co_filename=filename)
    if source is not None:
        _remember_source(filename, *source)
    return code


def _remember_source(filename: str, first: int, lines: tuple[str, ...]) -> None:
    """Lets ``traceback`` show the lines of a received function whose file this process cannot
    read (with the file present, linecache reads the file itself, as usual)."""
    entry: Any = linecache.cache.get(filename)  # (size, mtime, lines, name); mtime None: lazily set
    if entry is not None and entry[1] is not None:
        return  # read from a real file
    if entry is None:
        if os.path.exists(filename):
            return
        known: list[str] = []
    else:
        known = list(entry[2])
    end = first - 1 + len(lines)
    if len(known) < end:
        known.extend("\n" for _ in range(end - len(known)))
    known[first - 1:end] = lines
    # An mtime of None marks a lazily loaded entry, which linecache.checkcache leaves alone.
    linecache.cache[filename] = (sum(map(len, known)), None, known, filename)


_cloudpickle_override = cloudpickle.Pickler.reducer_override


class _Pickler(cloudpickle.Pickler):
    """cloudpickle, with ``__main__`` functions bound to the receiver's shared namespace, and
    multiprocessing's own queues carried over onto fibercore's (:mod:`fibercore.compat`), and
    code objects that keep their file name."""

    dispatch_table = collections.ChainMap({types.CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table)
    share_arrays_from = 0  # numpy globals of this many bytes or more go by shared memory (config)

    def reducer_override(self, obj: Any) -> Any:  # called for every non-atomic object: kept short
        mp_queues = sys.modules.get("multiprocessing.queues")  # none exists unless it was imported
        if mp_queues is not None and isinstance(obj, mp_queues.Queue):
            from fibercore.compat import reduce_mp_queue

            return reduce_mp_queue(obj)
        return _cloudpickle_override(self, obj)

    def _dynamic_function_reduce(self, func: types.FunctionType) -> Any:
        reduced = super()._dynamic_function_reduce(func)
        if not _is_main_globals(func.__globals__):
            return reduced
        _make, (code, _base_globals, name, argdefs, closure), (state, slotstate), *_ = reduced
        versions = _versions_of(slotstate["__globals__"], func.__globals__)
        if self.share_arrays_from > 0:
            _share_large_globals(slotstate["__globals__"], self.share_arrays_from)
        return (_make_main_function, (code, name, argdefs, closure), (state, slotstate, versions), None, None,
                _main_function_setstate)


#: Large numpy globals of ``__main__`` already in shared memory: id -> (the array, its wrapper).
_shared_globals: dict[int, tuple[weakref.ref[Any], Any]] = {}


def _share_large_globals(carried: dict[str, Any], at_least: int) -> None:
    """Replace each numpy array of ``at_least`` bytes among the globals a ``__main__`` function
    carries by a copy-on-write mapping of one shared copy on the machine
    (:mod:`fibercore.sharing`), made once per array: a task that reads a noise table as a
    global costs a few dozen bytes a call, and one copy per machine. Safe under this
    module's rule: a global travels again only when its name is rebound."""
    np = sys.modules.get("numpy")
    if np is None:
        return
    for name, value in carried.items():
        if type(value) is not np.ndarray:  # the sharing module is imported only for an array
            continue
        from fibercore.sharing import CopyOnWrite, large_array, shared

        if not large_array(value, at_least):
            continue
        known = _shared_globals.get(id(value))
        if known is None or known[0]() is not value:
            known = (weakref.ref(value), CopyOnWrite(shared(value)))
            _shared_globals[id(value)] = known
            weakref.finalize(value, _shared_globals.pop, id(value), None)
        carried[name] = known[1]


def _writable(part: Any) -> Any:
    if isinstance(part, memoryview) and not part.readonly:
        return part
    return bytearray(part)


def _fingerprint(func: types.FunctionType, seen: set[int]) -> tuple[Any, ...] | None:
    """What a ``__main__`` function's pickle depends on, or None when it cannot be told.

    The function object itself, plain defaults, and the version (see
    :func:`_versions_of`) of every global it names, recursively through the
    ``__main__`` functions it calls. A closure, a ``__main__`` class or anything
    else whose content could change unseen makes it None (no caching).
    """
    if func.__closure__ is not None or not _is_main_globals(func.__globals__):
        return None
    if set(func.__dict__) - {"__fiber_meta__"}:
        return None
    defaults = func.__defaults__ or ()
    kwdefaults = tuple(sorted((func.__kwdefaults__ or {}).items()))
    if any(type(v) not in _PLAIN for v in defaults) or any(type(v) not in _PLAIN for _, v in kwdefaults):
        return None
    seen.add(id(func))
    names = sorted(cloudpickle.cloudpickle._extract_code_globals(func.__code__))
    versions = _versions_of(names, func.__globals__)
    parts: list[Any] = [id(func), defaults, kwdefaults, tuple(sorted(versions.items()))]
    for name in names:
        value = func.__globals__.get(name)
        if isinstance(value, type) and value.__module__ == "__main__":
            return None
        if isinstance(value, types.FunctionType) and _is_main_globals(value.__globals__) and id(value) not in seen:
            inner = _fingerprint(value, seen)
            if inner is None:
                return None
            parts.append(inner)
    return tuple(parts)


#: The last pickle of each ``__main__`` function, with the fingerprint it was made at.
_pickled_functions: weakref.WeakKeyDictionary[types.FunctionType, tuple[Any, list[Any]]] = \
    weakref.WeakKeyDictionary()


def _out_of_band(buffers: list[Any]) -> Callable[[pickle.PickleBuffer], bool]:
    """A pickler's ``buffer_callback``: big buffers go to ``buffers`` (sent without a copy),
    small ones stay in band (cheaper there)."""

    def keep(buf: pickle.PickleBuffer) -> bool:
        raw = buf.raw()
        if raw.nbytes < _OOB_MIN:
            return True
        buffers.append(raw)
        return False

    return keep


class CloudpickleSerializer:
    name = "cloudpickle"

    def __init__(self, share_arrays_from: int = 0) -> None:
        self.share_arrays_from = share_arrays_from

    def dumps(self, obj: Any) -> list[Any]:
        kind = type(obj)
        if kind in _PLAIN:
            if kind is bytes and len(obj) >= _OOB_BYTES:
                return self._dumps_plain(_OutOfBand(obj))
            return [pickle.dumps(obj, protocol=5)]
        plain = _plain_kind(obj)
        if plain == 1:  # the C pickler: a few µs less per message than cloudpickle
            return [pickle.dumps(obj, protocol=5)]
        if plain == 1 | _NUMPY_INSIDE:  # ... with one global per numpy object, not two
            return [numpy_pickling.dumps(obj)]
        plain &= 3
        if plain == 3:  # ... with large bytes out of band, not copied into the stream
            return self._dumps_plain(_big_bytes_out_of_band(obj))
        if plain:  # ... and arrays of _OOB_MIN bytes or more out of band
            return self._dumps_plain(obj)
        if type(obj) is types.FunctionType:
            # The same unchanged function gives the same list of parts (not a new pickle):
            # a Pool recognises it and does not send an ES noise table again every map.
            fingerprint = _fingerprint(obj, set())
            if fingerprint is not None:
                cached = _pickled_functions.get(obj)
                if cached is not None and cached[0] == fingerprint:
                    return cached[1]
                parts = self._dumps(obj)
                _pickled_functions[obj] = (fingerprint, parts)
                return parts
        return self._dumps(obj)

    def _dumps_plain(self, obj: Any) -> list[Any]:
        buffers: list[Any] = []
        return [pickle.dumps(obj, protocol=5, buffer_callback=_out_of_band(buffers)), *buffers]

    def _dumps(self, obj: Any) -> list[Any]:
        buffers: list[Any] = []
        with io.BytesIO() as out:
            pickler = _Pickler(out, protocol=5, buffer_callback=_out_of_band(buffers))
            pickler.share_arrays_from = self.share_arrays_from
            pickler.dump(obj)
            data = out.getvalue()
        return [data, *buffers]

    def loads(self, parts: Sequence[Any]) -> Any:
        if len(parts) == 1:
            return pickle.loads(parts[0])
        # Out-of-band buffers arrive as slices of a received frame. The built-in
        # transport hands over writable frames owned by the receiver: arrays are
        # built on them without a copy. Read-only buffers are copied, so that
        # arrays are writable, as after multiprocessing.
        return pickle.loads(parts[0], buffers=[_writable(p) for p in parts[1:]])


class CloudpicklePlugin:
    FIBER_CONTRACT = 3

    @hookimpl(trylast=True)
    def fiber_serializer(self, config: Any) -> CloudpickleSerializer:
        return CloudpickleSerializer(int(config.get("share_arrays_from") or 0))


plugin = CloudpicklePlugin()
