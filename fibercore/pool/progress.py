"""A tqdm progress bar over one ``map``/``imap`` call, advanced as chunks complete.

Off by default. ``Pool(progress=True)``, ``pool.map(f, xs, progress=True)`` or the config
key ``pool_progress`` turns it on; a dict (``progress={"desc": "rollouts"}``) is passed to
``tqdm`` as keyword arguments. The bar is advanced from the pool's result thread, by the
number of items of each finished chunk, and closed when the call's last chunk is in.
"""

from __future__ import annotations

import threading
from typing import Any

from fibercore.errors import ConfigError

ProgressArg = bool | dict[str, Any] | None


def resolve(call: ProgressArg, pool: ProgressArg, config_value: bool | None) -> dict[str, Any] | None:
    """The tqdm keyword arguments for a call, or None for no bar (call > pool > config)."""
    for choice in (call, pool, config_value):
        if choice is None:
            continue
        if isinstance(choice, dict):
            return dict(choice)
        if isinstance(choice, bool):
            return {} if choice else None
        raise TypeError(f"progress must be True, False, None or a dict of tqdm arguments, not {choice!r}")
    return None


class Progress:
    """One bar: ``items(n)`` when a chunk of n items is in, ``chunks(n)`` once their number is known."""

    def __init__(self, what: str, total: int | None, options: dict[str, Any]) -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError:
            raise ConfigError(
                "a progress bar was asked for (progress=True or pool_progress) but tqdm is not "
                "installed: pip install tqdm (or pip install 'fibercore[progress]'), or turn it off"
            ) from None
        options.setdefault("desc", what)
        options.setdefault("total", total)
        options.setdefault("unit", "task")
        self._bar = tqdm(**options)
        self._lock = threading.Lock()
        self._chunks_done = 0
        self._chunks_total: int | None = None
        self._closed = False

    def items(self, n: int) -> None:
        """A chunk of ``n`` items has finished."""
        with self._lock:
            if self._closed:
                return
            self._bar.update(n)
            self._chunks_done += 1
            if self._chunks_done == self._chunks_total:
                self._close()

    def chunks(self, n: int) -> None:
        """The call has ``n`` chunks in all (known once its input is exhausted)."""
        with self._lock:
            self._chunks_total = n
            if self._chunks_done >= n:
                self._close()

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self._bar.close()
