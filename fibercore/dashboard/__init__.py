"""The web dashboard of one running program (``init(dashboard=True)``, ``FIBER_DASHBOARD=1``,
``fiber run --dashboard``): the master serves a page on 127.0.0.1 that shows what
``fiber top`` shows, plots over time and the log tail of any job. See docs/dashboard.md.

Needs aiohttp (``pip install 'fibercore[dashboard]'``); the page's plots are uPlot, served
from this package with the page (no internet resource at run time). The dashboard reads
the program through :mod:`fibercore.observe`; observe never imports it. A dashboard that
was asked for and cannot run is one WARNING line, and the program goes on without it.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import TYPE_CHECKING

from fibercore.errors import ConfigError
from fibercore.observe import recorder

if TYPE_CHECKING:
    from fibercore.dashboard.server import Dashboard
    from fibercore.observe.recorder import Recorder

_running: list[Dashboard] = []
_lock = threading.Lock()
_looked = 0  # the pid whose first job start looked at the `dashboard` setting
_refused = False  # said once that the dashboard cannot run


def start(found: Recorder, host: str, port: int) -> Dashboard:
    """Serve the dashboard of this master (once; later calls return the running one).
    Raises :class:`~fibercore.errors.ConfigError` (with the fix) when it cannot."""
    with _lock:
        if _running:
            return _running[0]
        try:
            from fibercore.dashboard.server import Dashboard
        except ImportError as exc:
            raise ConfigError(f"the dashboard needs aiohttp ({exc}): pip install 'fibercore[dashboard]', "
                              "or set dashboard = false") from None
        found.always = True
        found.wake()
        found.sample()
        try:
            board = Dashboard(found, host, port)
        except OSError as exc:
            raise ConfigError(f"the dashboard cannot listen on {host}:{port} ({exc.strerror or exc}): set "
                              "dashboard_port to a free port, or 0 for any") from None
        _running.append(board)
        atexit.register(board.close)
    print(f"fibercore: dashboard at {board.url}", file=sys.stderr, flush=True)
    return board


def if_asked(found: Recorder | None = None) -> Dashboard | None:
    """Start the dashboard when the ``dashboard`` setting asks for it (``init(dashboard=True)``
    and a master's first job call this). One WARNING line, and None, when it cannot run."""
    global _refused
    from fibercore.runtime import get_runtime

    rt = get_runtime()
    if rt.is_worker or not rt.config.get("dashboard"):
        return None
    if _running:
        return _running[0]
    try:
        found = found or recorder.current()
        if found is None:  # a child forked from a master: the master's dashboard is the program's
            return None
        return start(found, str(rt.config.get("dashboard_host")), int(rt.config.get("dashboard_port")))
    except Exception as exc:
        if not _refused:
            _refused = True
            print(f"fibercore: WARNING: no dashboard: {exc}", file=sys.stderr, flush=True)
        return None


def master_started() -> None:
    """A job is about to start: ``fiber top`` can find the program from now on, and the
    dashboard runs when asked for (looked at once per process; a dict lookup after that)."""
    global _looked
    found = recorder.master_started()
    if _looked != os.getpid():
        _looked = os.getpid()
        if found is not None:
            if_asked(found)


def url() -> str | None:
    """The running dashboard's address, token included (None when it is off)."""
    return _running[0].url if _running else None


__all__ = ["if_asked", "master_started", "start", "url"]
