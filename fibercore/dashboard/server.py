"""The dashboard's web server: aiohttp on its own event loop, in one thread of the master.

Everything it serves is under a random path (``/<prefix>/``) and needs the token: the page,
its scripts, the API. The URL the program prints carries both (``/<prefix>/?token=...``);
the first page load turns the token into a cookie of this instance only (its own name,
``HttpOnly``, ``SameSite=Strict``, ``Path=/<prefix>/``): no page on another port of
127.0.0.1 is ever sent it, and a cookie another page plants cannot shadow it. A request
whose ``Host`` is not this server's address, or whose path is outside the prefix, gets
nothing. It binds 127.0.0.1 unless ``dashboard_host`` says otherwise.

What another local user without the token can hold is bounded (:class:`_Conn`): at most
:data:`MAX_CONNECTIONS` connections (the oldest one not yet authenticated is shed for a
new one), each closed :data:`UNTRUSTED_SECONDS` after it was accepted unless it presented
the token, and :data:`UNTRUSTED_BYTES` read from it before then; header lines and fields
are small. The API answers from what the recorder sampled (one snapshot a second,
:mod:`fibercore.observe.recorder`): a request never walks the pools.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import secrets
import socket
import threading
from importlib import resources
from typing import Any

from aiohttp import web

from fibercore.observe import registry
from fibercore.observe.recorder import Recorder

log = logging.getLogger("fibercore.dashboard")

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
           "(it ends in ?token=...), or fibercore.dashboard.url() in the program.")
#: Connections held at once (the owner's page uses one or two); above it the oldest one that
#: has not presented the token is closed for the new one.
MAX_CONNECTIONS = 128
#: Connections accepted per turn of the loop (and the listen backlog asyncio sets at first).
ACCEPT_BATCH = 32
#: Kernel queue of connections not yet accepted (they hold no descriptor of the master).
LISTEN_BACKLOG = 512
#: Seconds a connection may stay without presenting the token, and bytes read from it meanwhile.
UNTRUSTED_SECONDS = 10.0
UNTRUSTED_BYTES = 16 * 1024
#: Seconds an authenticated connection may idle between requests.
KEEPALIVE_SECONDS = 15.0
#: aiohttp's parser limits: a request line, a header field, the number of headers.
MAX_LINE = 4096
MAX_FIELD = 4096
MAX_HEADERS = 32
_WILDCARD = {"", "0.0.0.0", "::"}


def _security_headers(response: web.StreamResponse) -> None:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Content-Security-Policy"] = (
        "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; frame-ancestors 'none'")


class _Conn(asyncio.Protocol):
    """One accepted connection, in front of aiohttp's handler: counted, and cut short unless
    it presents the token (:meth:`trust`) within :data:`UNTRUSTED_SECONDS` and
    :data:`UNTRUSTED_BYTES`."""

    def __init__(self, board: Dashboard, inner: asyncio.Protocol) -> None:
        self.board = board
        self.inner = inner
        self.transport: asyncio.Transport | None = None
        self.trusted = False
        self.admitted = False
        self.received = 0
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        if not self.board._admit(self):
            transport.abort()
            return
        self.admitted = True
        self._timer = asyncio.get_running_loop().call_later(UNTRUSTED_SECONDS, self.shed)
        self.inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if not self.admitted:
            return
        if not self.trusted:
            self.received += len(data)
            if self.received > UNTRUSTED_BYTES:
                self.shed()
                return
        self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.admitted else None

    def pause_writing(self) -> None:
        if self.admitted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.admitted:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.board._conns.pop(self, None)
        if self._timer is not None:
            self._timer.cancel()
        if self.admitted:
            self.admitted = False
            self.inner.connection_lost(exc)

    def trust(self) -> None:
        """It presented the token: aiohttp's keep-alive timeout governs it from now on."""
        self.trusted = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def shed(self) -> None:
        self.board._conns.pop(self, None)
        if self.transport is not None:
            self.transport.abort()


class Dashboard:
    """A running dashboard: its address, token and the thread that serves it."""

    def __init__(self, recorder: Recorder, host: str, port: int, token: str | None = None) -> None:
        self.recorder = recorder
        self.token = token or secrets.token_urlsafe(24)
        #: The random first segment of every path served, and this instance's cookie name.
        self.prefix = secrets.token_urlsafe(12)
        self.cookie = f"fiber_dashboard_{secrets.token_hex(6)}"
        self.host = host
        self.port = port
        self.hosts: frozenset[str] = frozenset()
        self._conns: dict[_Conn, None] = {}  # oldest first
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._server: asyncio.Server | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="fiber-dashboard", daemon=True)
        self._thread.start()
        self._started.wait(30)
        if self._error is not None:
            raise self._error

    @property
    def url(self) -> str:
        return f"http://{_bracket(self.host)}:{self.port}/{self.prefix}/?token={self.token}"

    # -- admission ----------------------------------------------------------------------------
    def _admit(self, conn: _Conn) -> bool:
        """Count a new connection; at the cap, shed the oldest that has not presented the token
        (False: every one held did; the new one is refused)."""
        if len(self._conns) >= MAX_CONNECTIONS:
            oldest = next((c for c in self._conns if not c.trusted), None)
            if oldest is None:
                return False
            oldest.shed()
        self._conns[conn] = None
        return True

    def _allowed_hosts(self) -> frozenset[str]:
        """The ``Host`` values this server answers: its own address and port (a name some DNS
        could point here, as a rebinding page would use, is not one)."""
        port = self.port
        names = {f"localhost:{port}"}
        if self.host in _WILDCARD:
            names |= {f"{n}:{port}" for n in (socket.gethostname(), socket.getfqdn()) if n}
        else:
            names.add(f"{_bracket(self.host)}:{port}")
        return frozenset(n.lower() for n in names)

    def _host_ok(self, value: str) -> bool:
        value = value.strip().lower()
        if value in self.hosts:
            return True
        if self.host not in _WILDCARD:
            return False
        name, _, port = value.rpartition(":")
        try:  # bound to every address: any address literal of this port (not a name)
            ipaddress.ip_address(name.strip("[]"))
        except ValueError:
            return False
        return port == str(self.port)

    # -- the app ------------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        root = f"/{self.prefix}"
        app.router.add_get(f"{root}/", self._index)
        app.router.add_get(f"{root}/static/{{name}}", self._static)
        app.router.add_get(f"{root}/api/state", self._state)
        app.router.add_get(f"{root}/api/logs/{{jid}}", self._logs)
        return app

    def _has_token(self, request: web.Request) -> bool:
        token = self.token.encode()
        given = [request.query.get("token"), request.headers.get("X-Fiber-Token")]
        for header in request.headers.getall("Cookie", []):  # every value of our name, not the last one
            for part in header.split(";"):
                name, sep, value = part.strip().partition("=")
                if sep and name == self.cookie:
                    given.append(value.strip().strip('"'))
        return any(g is not None and hmac.compare_digest(g.encode(), token) for g in given)

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse
        if not self._host_ok(request.headers.get("Host", "")):
            response = web.Response(status=421, text="")
        elif not request.path.startswith(f"/{self.prefix}/"):
            response = web.Response(status=404, text="")
        elif not self._has_token(request):
            response = web.Response(status=403, text=REFUSED)
        else:
            conn = request.transport.get_protocol() if request.transport is not None else None
            if isinstance(conn, _Conn):
                conn.trust()
            response = await handler(request)
            if request.query.get("token"):
                response.set_cookie(self.cookie, self.token, httponly=True, samesite="Strict",
                                    path=f"/{self.prefix}/")
            _security_headers(response)
            return response
        response.force_close()  # nothing more on a connection that did not present the token
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
        self._loop.set_exception_handler(_quiet)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as exc:
            self._error = exc
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()

    async def _start(self) -> None:
        runner = web.AppRunner(self._app(), access_log=None, handle_signals=False,
                               keepalive_timeout=KEEPALIVE_SECONDS, max_line_size=MAX_LINE,
                               max_field_size=MAX_FIELD, max_headers=MAX_HEADERS)
        await runner.setup()
        handlers = runner.server
        assert handlers is not None
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), self.port))
            server = await self._loop.create_server(lambda: _Conn(self, handlers()), sock=sock,
                                                    backlog=ACCEPT_BATCH)
        except BaseException:
            sock.close()
            raise
        sock.listen(LISTEN_BACKLOG)  # a deeper kernel queue; asyncio still accepts ACCEPT_BATCH a turn
        self._runner, self._server = runner, server
        if server.sockets:  # port 0: the one the OS chose
            self.port = server.sockets[0].getsockname()[1]
        self.hosts = self._allowed_hosts()

    def close(self) -> None:
        """Stop serving (at exit, or from a test)."""
        if not self._loop.is_running():
            return

        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for conn in list(self._conns):
                conn.shed()
            if self._runner is not None:
                await self._runner.cleanup()

        try:
            asyncio.run_coroutine_threadsafe(stop(), self._loop).result(5)
        except Exception:
            log.debug("dashboard: closing", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The dashboard loop's errors (a peer that reset, descriptors short for a moment): a
    debug line each, never a traceback per connection on the program's stderr."""
    log.debug("dashboard: %s", context.get("message"), exc_info=context.get("exception"))


def job_logs(jid: str) -> str | None:
    """The output of this program's job ``jid`` as its backend keeps it (None: no such job)."""
    from fibercore.runtime import get_runtime

    for p in registry.started():
        if p.job is not None and str(p.job.jid) == jid:
            return get_runtime().plugins.job_logs(p.job)
    return None


__all__ = ["Dashboard", "job_logs"]
