"""Built-in transport: TCP streams (or TLS over TCP with one config switch), stdlib only.

One TCP connection per peer, frames as length-prefixed records on the stream
(:mod:`fibercore.builtins.tcp.connection`). Addresses are ``tcp://host:port[/machine]``
(``tls+tcp://`` with TLS); ``machine`` says the listener also answers on a Unix socket named
after its identity, on the machine (and network namespace) with that
:func:`~fibercore.util.machine_identity` (:mod:`fibercore.builtins.tcp.local`).

Threads: one reactor thread per process accepts and authenticates the connections of every
listening endpoint (:mod:`~fibercore.builtins.tcp.reactor`, :mod:`~fibercore.builtins.tcp.admission`).
An authenticated connection is then read by the thread waiting in the listener's ``recv``
(:mod:`~fibercore.builtins.tcp.listener`), so a frame reaches the thread that handles it with
no hand-off between threads. A dialling endpoint has no thread
(:mod:`~fibercore.builtins.tcp.dialer`): ``recv`` reads its socket on the caller's thread, and
``send`` writes on the caller's thread. Why not nng: a round trip over pynng's Pair0 measured
176 µs against 23 µs for a multiprocessing Pipe and 22 µs for a Python TCP socket (README,
Benchmarks).

This module is the plugin: :class:`TcpTransport` opens the endpoints; the rooms it is built
from are listed in :mod:`fibercore.builtins.tcp`.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any

from fibercore.builtins.tcp import local as localpath
from fibercore.builtins.tcp.addresses import format_address
from fibercore.builtins.tcp.dialer import TcpDialer, dial
from fibercore.builtins.tcp.listener import TcpListener
from fibercore.builtins.tcp.local import bind_local
from fibercore.builtins.tcp.options import DEFAULT_SILENCE
from fibercore.builtins.tcp.spinning import DEFAULT_SPIN
from fibercore.builtins.tcp.tls import contexts
from fibercore.errors import TransportError
from fibercore.hookspecs import hookimpl
from fibercore.util import machine_identity
from fibercore.wire.handshake import Authenticator

__all__ = ["TcpDialer", "TcpListener", "TcpPlugin", "TcpTransport", "plugin"]


class TcpTransport:
    """Opens :class:`TcpListener` and :class:`TcpDialer` endpoints (tcp:// or tls+tcp://)."""

    name = "tcp"

    def __init__(self, tls: dict[str, Any] | None = None, spin: float = DEFAULT_SPIN,
                 silence: float = DEFAULT_SILENCE) -> None:
        self._tls_options = tls
        self._spin = max(0.0, spin)
        self._silence = silence
        self._scheme = "tls+tcp" if tls else "tcp"
        self._server_ctx: ssl.SSLContext | None = None
        self._client_ctx: ssl.SSLContext | None = None
        if tls:
            self._server_ctx, self._client_ctx = contexts(tls)

    def listen(self, kind: str, bind_host: str, advertise_host: str | None = None,
               auth: Authenticator | None = None, port: int = 0) -> TcpListener:
        if auth is None:
            raise TransportError("fibercore's tcp transport authenticates every connection: pass auth=")
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bind_host, port))
            sock.listen(512)
        except OSError as exc:
            sock.close()
            raise TransportError(
                f"cannot listen on {bind_host}: {exc}. Set listen_host/bind_host to an address of this machine."
            ) from exc
        sock.setblocking(False)
        port = sock.getsockname()[1]
        adv = advertise_host or bind_host
        local = bind_local(auth) if self._server_ctx is None and localpath.LOCAL_SOCKETS else None
        machine = machine_identity() if local is not None else ""
        address = format_address(self._scheme, adv, port, machine)
        return TcpListener(sock, address, auth, self._server_ctx, local, self._spin, self._silence)

    def dial(self, kind: str, address: str, auth: Authenticator | None = None) -> TcpDialer:
        if auth is None:
            raise TransportError("fibercore's tcp transport authenticates every connection: pass auth=")
        server_name = (self._tls_options or {}).get("server_name")
        return dial(address, auth, self._client_ctx, server_name, self._spin, self._silence)


class TcpPlugin:
    FIBER_CONTRACT = 3

    @hookimpl(trylast=True)
    def fiber_transport(self, config: Any) -> TcpTransport | None:
        if config is not None and (config.get("transport") or "tcp") != "tcp":
            return None  # another transport was asked for: its plugin answers (or none does)
        tls = None
        if config is not None and config.get("tls"):
            tls = {
                "cert": config.get("tls_cert_file"),
                "ca": config.get("tls_ca_file"),
                "server_name": config.get("tls_server_name"),
            }
        spin = DEFAULT_SPIN
        if config is not None and config.get("spin_wait") is not None:
            spin = float(config.get("spin_wait")) * 1e-6
        silence = float(config.get("heartbeat_timeout") or DEFAULT_SILENCE) if config is not None else DEFAULT_SILENCE
        return TcpTransport(tls, spin, silence)


plugin = TcpPlugin()
