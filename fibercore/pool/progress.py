"""A progress bar over one ``map``/``imap`` call, advanced as chunks complete.

Off by default. ``Pool(progress=True)``, ``pool.map(f, xs, progress=True)`` or the config
key ``pool_progress`` turns it on; a dict (``progress={"desc": "rollouts"}``) is passed to
``tqdm`` as keyword arguments. The bar is advanced from the pool's result thread, by the
number of items of each chunk that succeeded, and closed when the call's last chunk is in; a
chunk that failed (a task raised, or the pool was terminated or interrupted) does not advance
it. Without a ``chunksize`` (and without ``maxtasksperchild``, which counts chunks), a map with
a bar cuts its input into 8 times more chunks than without (``PROGRESS_CHUNKS``), so that the
bar moves.

With tqdm installed (``pip install 'fibercore[progress]'``) the bar is tqdm's (notebooks
too); without it, a plain one-line counter on stderr (``desc``, ``total``, ``unit`` and ``file``
of the dict are used, the other tqdm arguments ignored).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

ProgressArg = bool | dict[str, Any] | None
#: How many times more chunks a map with a bar and no ``chunksize`` is cut into (32 a worker,
#: against multiprocessing's 4): the bar moves in steps of 1/32 of a worker's share.
PROGRESS_CHUNKS = 8


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
        options.setdefault("desc", what)
        options.setdefault("total", total)
        options.setdefault("unit", "task")
        try:
            from tqdm.auto import tqdm
        except ImportError:
            self._bar: Any = PlainBar(options["desc"], options["total"], options["unit"], options.get("file"))
        else:
            self._bar = tqdm(**options)
        self._lock = threading.Lock()
        self._chunks_done = 0
        self._chunks_total: int | None = None
        self._closed = False

    def items(self, n: int) -> None:
        """A chunk of ``n`` items has finished (``n`` 0: a chunk that failed, or was given up
        when the pool was terminated or interrupted: the bar counts finished tasks only, so it
        stops where it was, and never jumps to its end)."""
        with self._lock:
            if self._closed:
                return
            if n:
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


class PlainBar:
    """The bar without tqdm: ``desc: 12/40 tasks (30%), 85.1 tasks/s`` on one line of stderr
    (or ``file``), redrawn at most 10 times a second on a terminal, printed once at the end
    elsewhere."""

    def __init__(self, desc: str, total: int | None, unit: str, file: Any = None) -> None:
        self.desc, self.total, self.unit = desc, total, unit
        self.n = 0
        self._file = file
        self._start = self._drawn = time.monotonic()
        out = self._out()
        self._tty = hasattr(out, "isatty") and out.isatty()

    def _out(self) -> Any:
        return self._file if self._file is not None else sys.stderr

    def update(self, n: int) -> None:
        self.n += n
        now = time.monotonic()
        if self._tty and now - self._drawn >= 0.1:
            self._drawn = now
            self._draw("\r")

    def close(self) -> None:
        self._draw("\r" if self._tty else "", end="\n")

    def line(self) -> str:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        done = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        share = f" ({100 * self.n // self.total}%)" if self.total else ""
        return f"{self.desc}: {done} {self.unit}s{share}, {self.n / elapsed:.1f} {self.unit}s/s"

    def _draw(self, start: str, end: str = "") -> None:
        try:
            out = self._out()
            out.write(f"{start}{self.line()}{end}")
            out.flush()
        except (OSError, ValueError):  # stderr closed: the counter is not worth an error
            pass
