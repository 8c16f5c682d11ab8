"""The result of one asynchronous call: ``ApplyResult`` (``AsyncResult``).

What ``Pool.apply_async`` and an ``AsyncManager`` proxy's calls return, so it lives apart from
both (the pool's own results, which fill chunk by chunk, are in :mod:`fibercore.pool.results`).
Same behaviour as ``multiprocessing.pool.ApplyResult``: the producer calls
``_set(index, ok, value)`` once; callbacks run in the producer's thread; ``get(timeout)``
raises :class:`fibercore.TimeoutError` (a ``multiprocessing.TimeoutError``).

Beyond multiprocessing: ``cancel()`` (when its producer can cancel: a Pool's task) and
done callbacks, which :func:`fibercore.wait` and :func:`fibercore.as_completed` use to
wait on many results at once without polling.
"""

from __future__ import annotations

import logging
import threading
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from fibercore.errors import TimeoutError

if TYPE_CHECKING:
    from fibercore.pool.progress import Progress

log = logging.getLogger("fibercore.pool")

T = TypeVar("T")
Callback = Callable[[Any], object] | None


def _call(callback: Callable[[Any], object], value: Any, what: str) -> None:
    try:
        callback(value)
    except Exception:  # a user callback must not stop result delivery
        log.exception("pool: the %s raised; results keep being delivered", what)


class ApplyResult(Generic[T]):
    """The result of one ``apply_async`` call."""

    def __init__(self, callback: Callback = None, error_callback: Callback = None) -> None:
        self._event = threading.Event()
        self._callback = callback
        self._error_callback = error_callback
        self._success = False
        self._value: Any = None
        self._progress: Progress | None = None  # a tqdm bar (pool/progress.py), off by default
        #: Set by the producer when the call can be cancelled: ``canceller(running)`` -> cancelled?
        #: (``running`` False: only while no worker holds the call.)
        self._canceller: Callable[[bool], bool] | None = None
        self._cancelled = False
        self._done_lock = threading.Lock()
        self._done_callbacks: list[Callable[[ApplyResult[Any]], object]] = []

    def ready(self) -> bool:
        """True once the call has completed (successfully or not)."""
        return self._event.is_set()

    def successful(self) -> bool:
        """Whether the call completed without raising; ValueError if it is not ready."""
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._success

    def wait(self, timeout: float | None = None) -> None:
        """Wait until the result is available or ``timeout`` seconds pass."""
        self._event.wait(timeout)

    def get(self, timeout: float | None = None) -> T:
        """The result; re-raises the task's exception; TimeoutError after ``timeout``."""
        self.wait(timeout)
        if not self.ready():
            raise TimeoutError(f"the result was not ready within {timeout} s")
        if self._success:
            return self._value
        raise self._value

    def cancel(self) -> bool:
        """Cancel the call: a queued task never runs; a running one's worker is stopped (and
        replaced) and ``get()`` raises :class:`fibercore.CancelledError`. False when the
        call had finished already or cannot be cancelled (a manager's call on its server)."""
        return self._cancel(running=True)

    def _cancel(self, running: bool) -> bool:
        if self.ready() or self._canceller is None:
            return False
        if not self._canceller(running):
            return False
        self._cancelled = True
        return True

    def _cancel_queued(self) -> bool:
        """Cancel the call only if no worker holds it yet (``shutdown(cancel_futures=True)``)."""
        return self._cancel(running=False)

    def cancelled(self) -> bool:
        """Whether :meth:`cancel` cancelled this call."""
        return self._cancelled

    def _add_done_callback(self, fn: Callable[[ApplyResult[Any]], object]) -> None:
        """Run ``fn(self)`` once the result is ready (now, if it is), in the producer's thread."""
        with self._done_lock:
            if not self._event.is_set():
                self._done_callbacks.append(fn)
                return
        _call(fn, self, "done callback")

    def _remove_done_callback(self, fn: Callable[[ApplyResult[Any]], object]) -> None:
        """Forget ``fn`` if it has not run (a ``wait`` that returned before this result was ready)."""
        with self._done_lock:
            try:
                self._done_callbacks.remove(fn)
            except ValueError:
                pass

    def _finish(self) -> None:
        """The result is ready: wake ``get()``, then the done callbacks."""
        with self._done_lock:
            self._event.set()
            callbacks, self._done_callbacks = self._done_callbacks, []
        for fn in callbacks:
            _call(fn, self, "done callback")

    def _set(self, index: int, ok: bool, value: Any) -> None:
        self._success, self._value = ok, value
        if ok and self._callback is not None:
            _call(self._callback, value, "callback")
        if not ok and self._error_callback is not None:
            _call(self._error_callback, value, "error_callback")
        self._finish()

    __class_getitem__: Any = classmethod(types.GenericAlias)


AsyncResult = ApplyResult


__all__ = ["ApplyResult", "AsyncResult", "Callback"]
