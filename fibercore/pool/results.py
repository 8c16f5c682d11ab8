"""What ``apply_async``, ``map_async``, ``imap`` and ``imap_unordered`` return.

Same behaviour as ``multiprocessing.pool``'s classes: results are set per chunk by
the pool's scheduler (``_set(chunk_index, ok, value)``), callbacks run in the
scheduler's thread, and ``get(timeout)`` raises :class:`fibercore.TimeoutError`
(a ``multiprocessing.TimeoutError``).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

from fibercore.errors import TimeoutError
from fibercore.pool.progress import Progress
from fibercore.results import ApplyResult, AsyncResult, Callback, _call

log = logging.getLogger("fibercore.pool")

T = TypeVar("T")


class MapResult(ApplyResult[list[Any]]):
    """The result of ``map_async``/``starmap_async``: a list, filled chunk by chunk.

    As in multiprocessing, it becomes ready when every chunk has finished; the
    first exception to arrive is the one ``get`` raises.
    """

    def __init__(self, chunksize: int, length: int, callback: Callback = None,
                 error_callback: Callback = None) -> None:
        super().__init__(callback, error_callback)
        self._success = True
        self._value = [None] * length
        self._length = length
        self._chunksize = chunksize
        self._lock = threading.Lock()
        if chunksize <= 0:
            self._number_left = 0
            self._event.set()
        else:
            self._number_left = length // chunksize + bool(length % chunksize)

    def _show(self, progress: Progress) -> None:
        """Advance ``progress`` as this result's chunks complete."""
        self._progress = progress
        progress.chunks(self._number_left)

    def _set(self, index: int, ok: bool, value: Any) -> None:
        if self._progress is not None:
            self._progress.items(len(value) if ok else 0)
        with self._lock:
            self._number_left -= 1
            left = self._number_left
            if ok and self._success:
                self._value[index * self._chunksize:(index + 1) * self._chunksize] = value
            elif not ok and self._success:
                self._success = False
                self._value = value
        if left:
            return
        if self._success and self._callback is not None:
            _call(self._callback, self._value, "callback")
        if not self._success and self._error_callback is not None:
            _call(self._error_callback, self._value, "error_callback")
        self._finish()


class IMapIterator(Iterator[Any]):
    """Results of ``imap`` in order, as they become available.

    With ``chunksize == 1`` an exception is raised at its position and iteration
    can go on; with larger chunks the iterator ends after raising (multiprocessing
    returns a generator there, which stops at the first exception).
    """

    def __init__(self, chunksize: int = 1) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._items: collections.deque[tuple[bool, Any]] = collections.deque()
        self._index = 0  # chunks moved to _items so far
        self._length: int | None = None  # number of chunks, once known
        self._unsorted: dict[int, tuple[bool, Any]] = {}
        self._chunksize = chunksize
        self._current: collections.deque[Any] = collections.deque()
        self._stopped = False
        self._progress: Progress | None = None

    def __iter__(self) -> IMapIterator:
        return self

    def next(self, timeout: float | None = None) -> Any:
        """The next result; TimeoutError if none arrives within ``timeout`` seconds."""
        while True:
            if self._current:
                return self._current.popleft()
            if self._stopped:
                raise StopIteration
            with self._cond:
                if not self._items:
                    if self._index == self._length:
                        raise StopIteration
                    self._cond.wait(timeout)
                    if not self._items:
                        if self._index == self._length:
                            raise StopIteration
                        raise TimeoutError(f"no result within {timeout} s")
                ok, value = self._items.popleft()
            if not ok:
                if self._chunksize > 1:
                    self._stopped = True
                raise value
            self._current.extend(value)

    __next__ = next

    def _push(self, item: tuple[bool, Any]) -> None:
        self._items.append(item)
        self._index += 1
        self._cond.notify()

    def _show(self, progress: Progress) -> None:
        """Advance ``progress`` as this iterator's chunks complete."""
        self._progress = progress

    def _set(self, index: int, ok: bool, value: Any) -> None:
        if self._progress is not None:
            self._progress.items(len(value) if ok else 0)
        with self._cond:
            if index == self._index:
                self._push((ok, value))
                while self._index in self._unsorted:
                    self._push(self._unsorted.pop(self._index))
            else:
                self._unsorted[index] = (ok, value)

    def _set_length(self, length: int) -> None:
        """Called once the input is exhausted: ``length`` chunks in all."""
        if self._progress is not None:
            self._progress.chunks(length)
        with self._cond:
            self._length = length
            if self._index == length:
                self._cond.notify_all()


class IMapUnorderedIterator(IMapIterator):
    """Results of ``imap_unordered``, in the order chunks complete."""

    def _set(self, index: int, ok: bool, value: Any) -> None:
        if self._progress is not None:
            self._progress.items(len(value) if ok else 0)
        with self._cond:
            self._push((ok, value))


__all__ = ["ApplyResult", "AsyncResult", "IMapIterator", "IMapUnorderedIterator", "MapResult"]
