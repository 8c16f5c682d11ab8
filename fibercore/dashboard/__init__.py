"""The web dashboard of one running program (``init(dashboard=True)``, ``FIBER_DASHBOARD=1``,
``fiber run --dashboard``): the master serves a page on 127.0.0.1 that shows what
``fiber top`` shows, plots over time and the log tail of any job. See docs/dashboard.md.

Needs aiohttp (``pip install 'fibercore[dashboard]'``); the page's plots are uPlot, served
from this package with the page (no internet resource at run time).
"""

from __future__ import annotations

import atexit
import sys
import threading
from typing import TYPE_CHECKING

from fibercore.errors import ConfigError

if TYPE_CHECKING:
    from fibercore.dashboard.server import Dashboard
    from fibercore.observe.recorder import Recorder

_running: list[Dashboard] = []
_lock = threading.Lock()


def start(recorder: Recorder, host: str, port: int) -> Dashboard:
    """Serve the dashboard of this master (once; later calls return the running one)."""
    with _lock:
        if _running:
            return _running[0]
        try:
            from fibercore.dashboard.server import Dashboard
        except ImportError as exc:
            raise ConfigError(f"the dashboard needs aiohttp ({exc}): pip install 'fibercore[dashboard]', "
                              "or set dashboard = false") from None
        recorder.always = True
        recorder.wake()
        recorder.sample()
        try:
            board = Dashboard(recorder, host, port)
        except OSError as exc:
            raise ConfigError(f"the dashboard cannot listen on {host}:{port} ({exc}): set dashboard_port to a "
                              "free port, or 0 for any") from None
        _running.append(board)
        atexit.register(board.close)
    print(f"fibercore: dashboard at {board.url}", file=sys.stderr, flush=True)
    return board


def url() -> str | None:
    """The running dashboard's address, token included (None when it is off)."""
    return _running[0].url if _running else None


__all__ = ["start", "url"]
