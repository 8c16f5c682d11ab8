"""Built-in transport: nng through pynng (tcp, or tls+tcp with one config switch).

``pair``   → nng Pair0 (one peer each side).
``router`` → nng Pair1 in polyamorous mode on the listener, so that a reply can be
             addressed to the pipe (peer connection) a request came from; Pair1 on
             the dialling side.

nng costs ~25–30 µs per send or receive whatever the size (reference/realparts.md),
so the core batches small messages into one frame; this module sends frames as is.
The receive size limit is lifted (nng's default is 1 MiB).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import types
from collections.abc import Hashable
from typing import Any

from fibercore.errors import TransportClosed, TransportError, TransportTimeout
from fibercore.hookspecs import hookimpl
from fibercore.transport import PeerCallback


def _defer_pynng_asyncio() -> None:
    """Import pynng without asyncio (~30 ms of every job's start-up).

    pynng imports its asyncio helpers (``pynng._aio``) eagerly but uses them only in
    its ``a*`` coroutine methods, which fibercore never calls. A placeholder module
    imports the real one the first time anything asks it for a name, so code that
    does use pynng's async API still works.
    """
    if "pynng" in sys.modules or "pynng._aio" in sys.modules:
        return
    stub = types.ModuleType("pynng._aio")

    def load(name: str) -> Any:
        if sys.modules.get("pynng._aio") is stub:
            del sys.modules["pynng._aio"]
            real = importlib.import_module("pynng._aio")
            stub.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
        return stub.__dict__[name] if name in stub.__dict__ else getattr(sys.modules["pynng._aio"], name)

    stub.__getattr__ = load  # type: ignore[method-assign]
    sys.modules["pynng._aio"] = stub


_defer_pynng_asyncio()

import pynng  # noqa: E402
from pynng import ffi, lib  # noqa: E402
from pynng.exceptions import check_err  # noqa: E402


def _nbytes(part: Any) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _free_later(raw: Any) -> Any:
    """A pointer to ``raw``'s body that frees the nng message when no view uses it."""
    body = ffi.cast("char *", lib.nng_msg_body(raw))
    return ffi.gc(body, lambda _body: lib.nng_msg_free(raw))


class NngEndpoint:
    def __init__(self, sock: pynng.Socket, address: str, addressed: bool) -> None:
        self._sock = sock
        self.address = address
        self._addressed = addressed  # router listener: frames carry their pipe
        self._timeout_ms: int | None = None
        self._lock = threading.Lock()
        self._closed = False

    def send(self, data: bytes, peer: Hashable | None = None) -> None:
        self.send_parts([data], peer)

    def send_parts(self, parts: list[Any], peer: Hashable | None = None, block: bool = True) -> None:
        """Send the parts as one frame: each is copied once, straight into the nng message.

        ``block=False`` raises TransportTimeout instead of waiting for room (or a peer).
        """
        msg_p = ffi.new("nng_msg **")
        try:
            check_err(lib.nng_msg_alloc(msg_p, sum(_nbytes(p) for p in parts)))
            raw = msg_p[0]
            body = ffi.cast("char *", lib.nng_msg_body(raw))
            offset = 0
            for part in parts:
                n = _nbytes(part)
                if n:
                    ffi.memmove(body + offset, part, n)
                    offset += n
            if peer is not None:
                check_err(lib.nng_msg_set_pipe(raw, peer.pipe))  # type: ignore[attr-defined]
            err = lib.nng_sendmsg(self._sock.socket, raw, 0 if block else lib.NNG_FLAG_NONBLOCK)
            if err:  # nng frees the message only when it accepted it
                lib.nng_msg_free(raw)
                check_err(err)
        except (pynng.TryAgain, pynng.Timeout) as exc:
            raise TransportTimeout(f"{self.address} cannot take a frame now") from exc
        except pynng.Closed as exc:
            raise TransportClosed(f"endpoint {self.address} is closed") from exc
        except pynng.NNGException as exc:
            raise TransportError(f"send on {self.address} failed: {exc}") from exc

    def _recv(self, flags: int) -> tuple[memoryview, Hashable]:
        """One message as a writable view of nng's own buffer (no copy), and its pipe."""
        msg_p = ffi.new("nng_msg **")
        check_err(lib.nng_recvmsg(self._sock.socket, msg_p, flags))
        raw = msg_p[0]
        peer = None
        if self._addressed:
            wrapper = pynng.Message(raw)
            self._sock._try_associate_msg_with_pipe(wrapper)
            peer = wrapper.pipe
            wrapper._mem_freed = True  # the view below owns the message now
        size = lib.nng_msg_len(raw)
        return memoryview(ffi.buffer(_free_later(raw), size)), peer

    def recv(self, timeout: float | None = None) -> tuple[memoryview, Hashable]:
        if timeout == 0:  # a poll: a flag, not the shared socket option another thread may rely on
            try:
                return self._recv(lib.NNG_FLAG_NONBLOCK)
            except pynng.TryAgain as exc:
                raise TransportTimeout(f"no frame waiting on {self.address}") from exc
            except pynng.Closed as exc:
                raise TransportClosed(f"endpoint {self.address} is closed") from exc
        ms = -1 if timeout is None else max(1, int(timeout * 1000))
        if ms != self._timeout_ms:
            self._sock.recv_timeout = ms
            self._timeout_ms = ms
        try:
            return self._recv(0)
        except pynng.Timeout as exc:
            raise TransportTimeout(f"no frame on {self.address} within {timeout} s") from exc
        except pynng.Closed as exc:
            raise TransportClosed(f"endpoint {self.address} is closed") from exc

    def on_peer_event(self, callback: PeerCallback) -> None:
        self._sock.add_post_pipe_connect_cb(lambda pipe: callback(pipe, True))
        self._sock.add_post_pipe_remove_cb(lambda pipe: callback(pipe, False))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._sock.close()
        except Exception:  # pragma: no cover - closing twice races in pynng
            pass

    def __repr__(self) -> str:
        return f"<NngEndpoint {self.address}>"


#: Seconds a blocking send on a pair endpoint waits before it raises TransportTimeout.
PAIR_SEND_SLICE = 0.25

#: This process (or the one it was forked from) has opened nng sockets.
_nng_used = False
#: A fork happened after that: nng aborts the process on any call, so dial in Python.
_nng_forked = False


def _after_fork_in_child() -> None:
    """nng aborts a forked child on any call, even closing a socket: the parent's
    sockets must never be closed here (they are the parent's; the OS closes the
    child's copies of their descriptors), so closing and collecting them is a no-op."""
    global _nng_forked
    if not _nng_used:
        return
    _nng_forked = True
    _make_inert("close", "__del__")


def _make_inert(*methods: str) -> None:
    """Turn these methods of pynng's sockets and contexts into no-ops (in this process only)."""

    def inert(self: Any, *args: Any) -> None:
        return None

    for cls in (pynng.Socket, pynng.Context):
        for name in methods:
            setattr(cls, name, inert)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _no_close_on_collect() -> None:
    """At exit, after every handler that closes sockets on purpose: a socket still alive
    is not closed when the interpreter collects it. nng's close waits for the pipe
    callbacks it runs into Python, and once finalisation has begun no other thread
    gets the GIL: the process hung at exit (the OS closes the descriptors anyway)."""
    _make_inert("__del__")


class NngTransport:
    name = "nng"

    def __init__(self, tls: dict[str, Any] | None = None) -> None:
        self._tls = tls
        self._scheme = "tls+tcp" if tls else "tcp"
        # fibercore's receiver threads are daemons still inside nng_recvmsg at exit;
        # pynng's atexit nng_fini would tear nng down under them (nng panics and the
        # process aborts). The OS closes the sockets instead.
        self.prepare_exit()

    def _socket(self, kind: str, listening: bool) -> pynng.Socket:
        global _nng_used
        _nng_used = True
        opts: dict[str, Any] = {}
        if self._tls:
            mode = pynng.TLSConfig.MODE_SERVER if listening else pynng.TLSConfig.MODE_CLIENT
            tls_kw: dict[str, Any] = {"ca_files": [self._tls["ca"]]} if self._tls.get("ca") else {}
            if self._tls.get("cert"):
                tls_kw["cert_key_file"] = self._tls["cert"]
            if not listening and self._tls.get("server_name"):
                tls_kw["server_name"] = self._tls["server_name"]
            tls_kw["auth_mode"] = pynng.TLSConfig.AUTH_MODE_REQUIRED
            opts["tls_config"] = pynng.TLSConfig(mode, **tls_kw)
        if kind == "pair":
            sock = pynng.Pair0(**opts)
        elif kind == "router":
            sock = pynng.Pair1(polyamorous=listening, **opts)
        else:
            raise ValueError(f"unknown endpoint kind {kind!r} (expected 'pair' or 'router')")
        sock.recv_max_size = 0  # nng's default caps frames at 1 MiB
        sock.reconnect_time_min = 10
        sock.reconnect_time_max = 1000
        if kind == "pair":
            # A blocking send on a pair waits for a peer; it must come back now and then so
            # that a sender can notice the peer is gone (wire.Sender retries until then).
            sock.send_timeout = int(PAIR_SEND_SLICE * 1000)
        return sock

    def prepare_exit(self) -> None:
        """Skip pynng's nng_fini at exit: it can block on, or crash, sockets other threads use.

        The OS closes the sockets when the process ends.
        """
        import atexit

        import pynng.nng

        atexit.unregister(getattr(pynng.nng, "_pynng_atexit", lambda: None))
        atexit.unregister(_no_close_on_collect)
        atexit.register(_no_close_on_collect)  # first registered of ours: runs after them


    def listen(self, kind: str, bind_host: str, advertise_host: str | None = None) -> NngEndpoint:
        if _nng_forked:
            raise TransportError(
                "this process was forked from one that uses fibercore, and nng does not work after "
                "fork: it can use the queues, pipes and managers it inherited or was given, but not "
                "create new ones or start jobs. Start it with multiprocessing's 'spawn' or "
                "'forkserver' method (multiprocessing.get_context('spawn')), or create the objects "
                "before the fork.")
        sock = self._socket(kind, listening=True)
        host = f"[{bind_host}]" if ":" in bind_host else bind_host
        try:
            listener = sock.listen(f"{self._scheme}://{host}:0")
        except pynng.NNGException as exc:
            sock.close()
            raise TransportError(
                f"cannot listen on {bind_host}: {exc}. Set listen_host/bind_host to an "
                "address of this machine."
            ) from exc
        port = str(listener.local_address).rsplit(":", 1)[1]
        adv = advertise_host or bind_host
        adv = f"[{adv}]" if ":" in adv else adv
        return NngEndpoint(sock, f"{self._scheme}://{adv}:{port}", addressed=kind == "router")

    def dial(self, kind: str, address: str) -> Any:
        if _nng_forked:
            from fibercore.builtins.sp_socket import SPDialer

            try:
                return SPDialer(kind, address)
            except OSError as exc:
                raise TransportError(f"cannot connect to {address}: {exc}") from exc
        sock = self._socket(kind, listening=False)
        try:
            sock.dial(address, block=True)
        except pynng.NNGException as exc:
            sock.close()
            raise TransportError(f"cannot connect to {address}: {exc}") from exc
        return NngEndpoint(sock, address, addressed=False)


class NngPlugin:
    @hookimpl(trylast=True)
    def fiber_transport(self, config: Any) -> NngTransport:
        tls = None
        if config is not None and config.get("tls"):
            tls = {
                "cert": config.get("tls_cert_file"),
                "ca": config.get("tls_ca_file"),
                "server_name": config.get("tls_server_name"),
            }
        return NngTransport(tls)


plugin = NngPlugin()
