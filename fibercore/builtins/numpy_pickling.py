"""Small numpy objects pickled with one global each instead of two (an RL step's action and
observation: ``("step", np.int64(1))``, ``(obs, reward, terminated, truncated)``).

numpy pickles a scalar as ``scalar(dtype, bytes)`` and a small array as
``_frombuffer(buffer, dtype, shape, order)``, each dtype as ``dtype(code, ...)`` plus its
state. Every global in a pickle costs the C pickler an import look-up (about 1 µs here, as
much as the rest of a small message), so ``("step", np.int64(1))`` took 4.6 µs to pickle
against 0.2 µs for ``("step", 1)``. Here the dtype travels as its code string (``"<f4"``),
which rebuilds it exactly, and the object as one call of this module's rebuilders: the
same values, types, shapes, byte order and writability as numpy's own pickle gives
(a read-only array comes back read-only, a writable one writable, in its own memory).

Only what the code string rebuilds exactly is taken (numbers, booleans, dates; C-contiguous
arrays of numbers and booleans); anything else (a structured dtype, a Fortran-ordered or
non-contiguous array, a subclass) pickles as numpy pickles it.
"""

from __future__ import annotations

import io
import pickle
import threading
from typing import Any

#: dtype kinds taken: their code string (``dtype.str``) rebuilds the dtype exactly. Arrays
#: only of those whose memory the buffer protocol gives (not dates: numpy pickles them).
_KINDS = frozenset("biufcmM")
_ARRAY_KINDS = frozenset("biufc")


#: Code strings received -> their dtypes (a dtype made from a string costs more than the
#: small object it describes); at most _DTYPES_KEPT kept, the others made each time.
_dtype_of: dict[str, Any] = {}
_DTYPES_KEPT = 256


def _dtype(code: str) -> Any:
    """The dtype of ``code``, not in :data:`_dtype_of` yet: made, and kept there."""
    import numpy as np

    dtype = np.dtype(code)
    if len(_dtype_of) < _DTYPES_KEPT:
        _dtype_of[code] = dtype
    return dtype


def _numpy_scalar_maker() -> Any:
    """numpy's own maker of a scalar from its dtype and bytes: what numpy's pickle of a scalar calls."""
    try:
        from numpy._core.multiarray import scalar
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import scalar  # type: ignore[no-redef]
    return scalar


_scalar_maker: Any = None


def np_scalar(code: str, raw: bytes) -> Any:
    """The numpy scalar of dtype ``code`` held in ``raw`` (what :func:`_reduce_scalar` sends)."""
    global _scalar_maker
    if _scalar_maker is None:
        _scalar_maker = _numpy_scalar_maker()
    dtype = _dtype_of.get(code)
    return _scalar_maker(_dtype(code) if dtype is None else dtype, raw)


def np_array(data: Any, code: str, shape: tuple[int, ...]) -> Any:
    """The C-ordered array of dtype ``code`` and ``shape`` on ``data`` (a bytearray when the
    array sent was writable, bytes when it was read-only, as numpy's own pickle gives)."""
    import numpy as np

    dtype = _dtype_of.get(code)
    # (an ndarray on the buffer, as frombuffer().reshape() gives, in one call)
    return np.ndarray(shape, _dtype(code) if dtype is None else dtype, data)


#: A dtype of a kind in _KINDS -> its code string, or None: numpy pickles it. Only those
#: kinds are kept (numbers and dates in their byte orders and units: a few dozen at most).
_codes: dict[Any, str | None] = {}


def _code(dtype: Any) -> str | None:
    """``dtype``'s code string when it rebuilds ``dtype`` exactly, else None. Metadata is
    looked at every time: a dtype with metadata equals (and hashes as) the one without."""
    if dtype.metadata or dtype.kind not in _KINDS:
        return None
    code = _codes.get(dtype)
    if code is None and dtype not in _codes:
        import numpy as np

        code = dtype.str if np.dtype(dtype.str) == dtype else None
        _codes[dtype] = code
    return code


def _reduce_scalar(x: Any) -> Any:
    code = _code(x.dtype)
    if code is None:
        return x.__reduce_ex__(5)
    return np_scalar, (code, x.tobytes())


def _reduce_array(a: Any) -> Any:
    code = _code(a.dtype)
    if code is None or a.dtype.kind not in _ARRAY_KINDS or not a.flags.c_contiguous or not a.size:
        return a.__reduce_ex__(5)
    # In band, as numpy's own: a bytearray for a writable array, bytes for a read-only one.
    return np_array, (pickle.PickleBuffer(a), code, a.shape)


def _scalar_reducer(code: str) -> Any:
    """:func:`_reduce_scalar` for a scalar type whose every value has the dtype of ``code``: a
    number or boolean (in this machine's byte order, as numpy gives every scalar; dates are not
    such a type: their unit differs from value to value)."""

    def reduce(x: Any) -> Any:
        return np_scalar, (code, x.tobytes())

    return reduce


_table: dict[type, Any] | None = None


def _dispatch_table() -> dict[type, Any]:
    """The reducers, by exact type: ndarray, and every numpy scalar type of a kind in _KINDS."""
    global _table
    if _table is None:
        import numpy as np

        table: dict[type, Any] = {np.ndarray: _reduce_array}
        for kind in set(np.sctypeDict.values()):
            if isinstance(kind, type) and issubclass(kind, np.generic) and np.dtype(kind).kind in _KINDS:
                code = _code(np.dtype(kind)) if np.dtype(kind).kind in _ARRAY_KINDS else None
                table[kind] = _reduce_scalar if code is None else _scalar_reducer(code)
        _table = table
    return _table


def _pickler(out: io.BytesIO) -> pickle.Pickler:
    pickler = pickle.Pickler(out, protocol=5)
    pickler.dispatch_table = _dispatch_table()
    return pickler


class _Reused(threading.local):
    """This thread's pickler and its buffer, made at its first dump (a pickler costs more
    than the small message it writes; and numpy is imported only once data holds it);
    ``busy`` while a dump runs, so a dump re-entered on the thread (a signal handler that
    sends) takes a pickler of its own."""

    def __init__(self) -> None:
        self.out: io.BytesIO | None = None
        self.pickler: pickle.Pickler | None = None
        self.busy = False


_reused = _Reused()


def dumps(obj: Any) -> bytes:
    """``pickle.dumps(obj, protocol=5)`` for plain data holding small numpy objects (no
    buffer out of band), with each numpy object as one global (see the module's docstring);
    ``pickle.loads`` reads it."""
    mine = _reused
    if mine.busy:
        fresh = io.BytesIO()
        _pickler(fresh).dump(obj)
        return fresh.getvalue()
    mine.busy = True
    try:
        out, pickler = mine.out, mine.pickler
        if out is None or pickler is None:
            out = mine.out = io.BytesIO()
            pickler = mine.pickler = _pickler(out)
        try:
            pickler.dump(obj)
            return out.getvalue()
        finally:  # keep nothing of the message: the memo holds its objects, the buffer its bytes
            pickler.clear_memo()
            out.seek(0)
            out.truncate()
    finally:
        mine.busy = False


__all__ = ["dumps", "np_array", "np_scalar"]
