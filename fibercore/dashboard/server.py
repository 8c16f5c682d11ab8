"""The dashboard's web server: aiohttp on its own event loop, in one thread of the master.

Everything it serves needs the token: the page, its scripts, the API. The URL the program
prints carries it (``?token=...``); the first page load turns it into a cookie
(``HttpOnly``, ``SameSite=Strict``) for the page's own requests. It binds 127.0.0.1 unless
``dashboard_host`` says otherwise. The API answers from what the recorder sampled (one
snapshot a second, :mod:`fibercore.observe.recorder`): a request never walks the pools.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import secrets
import threading
from importlib import resources
from typing import Any

from aiohttp import web

from fibercore.observe.recorder import Recorder

log = logging.getLogger("fibercore.dashboard")

COOKIE = "fiber_dashboard"
#: The files of the page, by name, and their types (nothing else is served).
STATIC = {
    "index.html": "text/html",
    "dashboard.js": "text/javascript",
    "dashboard.css": "text/css",
    "uPlot.iife.min.js": "text/javascript",
    "uPlot.min.css": "text/css",
}
#: Characters of a job's output the log view shows (its end).
LOG_TAIL = 32_000
REFUSED = ("fibercore dashboard: this needs the dashboard's token. Open the URL the program printed "
           "(it ends in ?token=...), or fibercore.dashboard_url() in the program.")


def _security_headers(response: web.StreamResponse) -> None:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")


class Dashboard:
    """A running dashboard: its address, token and the thread that serves it."""

    def __init__(self, recorder: Recorder, host: str, port: int, token: str | None = None) -> None:
        self.recorder = recorder
        self.token = token or secrets.token_urlsafe(24)
        self.host = host
        self.port = port
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="fiber-dashboard", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/?token={self.token}"

    # -- the app ------------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.router.add_get("/", self._index)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/state", self._state)
        app.router.add_get("/api/logs/{jid}", self._logs)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        given = (request.query.get("token") or request.headers.get("X-Fiber-Token")
                 or request.cookies.get(COOKIE) or "")
        if not hmac.compare_digest(given.encode(), self.token.encode()):
            response: web.StreamResponse = web.Response(status=403, text=REFUSED)
        else:
            response = await handler(request)
            if request.query.get("token"):
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="Strict", path="/")
        _security_headers(response)
        return response

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return self._file("index.html")

    async def _static(self, request: web.Request) -> web.StreamResponse:
        return self._file(request.match_info["name"])

    def _file(self, name: str) -> web.Response:
        kind = STATIC.get(name)
        if kind is None:
            raise web.HTTPNotFound()
        body = resources.files("fibercore.dashboard").joinpath("static", name).read_bytes()
        return web.Response(body=body, content_type=kind, charset="utf-8")

    async def _state(self, request: web.Request) -> web.StreamResponse:
        try:
            since = float(request.query.get("since", "0"))
        except ValueError:
            since = 0.0
        rec = self.recorder
        history = [p for p in list(rec.history) if p["t"] > since]
        body = {"snapshot": rec.latest, "history": history}
        return web.json_response(body, dumps=lambda obj: json.dumps(obj, default=str))

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        jid = request.match_info["jid"]
        text = await asyncio.get_running_loop().run_in_executor(None, job_logs, jid)
        if text is None:
            raise web.HTTPNotFound(text=f"no job {jid} of this program")
        return web.json_response({"jid": jid, "text": text[-LOG_TAIL:]})

    # -- the thread ---------------------------------------------------------------------------
    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self._runner = runner
        sockets = getattr(site._server, "sockets", None)
        if sockets:  # port 0: the one the OS chose
            self.port = sockets[0].getsockname()[1]

    def close(self) -> None:
        """Stop serving (at exit, or from a test)."""
        if not self._loop.is_running():
            return

        async def stop() -> None:
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        except Exception:
            log.debug("dashboard: closing", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def job_logs(jid: str) -> str | None:
    """The output of this program's job ``jid`` as its backend keeps it (None: no such job)."""
    from fibercore.observe.snapshot import children
    from fibercore.runtime import get_runtime

    for p in children():
        job = getattr(p._popen, "job", None)
        if job is not None and str(job.jid) == jid:
            return get_runtime().plugins.job_logs(job)
    return None


__all__ = ["COOKIE", "Dashboard", "job_logs"]
