"""Managers and proxies (``multiprocessing.managers``) whose server is a job.

::

    process with proxies                               manager server (a job)
    proxy._callmethod ─▶ client (one per process       serving threads: the one that reads
                          and server; request ids)     a request runs it (lanes keep order)
                          ◀─ future per call: the  ◀── REPLY
                             first waiting thread reads every answer

Request: op (CREATE, CALL, INCREF, DECREF, SHUTDOWN), parts ``[u64 request id, u64
object id, u64 calling thread] + pickle``; answer: op REPLY, ``[u64 request id, u64
kind (RETURN, ERROR, PROXY)] + pickle``.

* ``BaseManager.start()`` runs the server as a Process on the selected backend; the
  server sends its address back through a Pipe. ``connect()`` joins a running one.
* Every connection authenticates first (the session secret, or the manager's
  ``authkey``; a wrong one is ``AuthenticationError``) and every frame after it:
  nothing from an unauthenticated peer is unpickled.
* A proxy pickles to its token (type, server address, object id); unpickled in
  another job it connects to the server and keeps working. The server keeps an
  object while proxies reference it (incref on creation and unpickling, decref
  when a proxy is collected).
* Calls on one object from one thread run in order; calls from other threads, or on
  other objects, run in parallel (a call that blocks, such as a queue's ``get``, holds
  up no other thread: a ``put`` from another thread of the same process reaches it).
  :class:`AsyncManager` proxies return a handle per call at once.
"""

from __future__ import annotations

import array
import functools
import itertools
import logging
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fibercore import lifetime, liveness, sync
from fibercore.errors import (
    AuthenticationError,
    ProcessError,
    TimeoutError,
    TransportClosed,
    TransportError,
    WeakAuthkeyWarning,
)
from fibercore.observe import registry
from fibercore.rpc import (
    ERROR,
    HEAD,
    REPLY,
    REQUEST,
    RETURN,
    Client,
    Future,
    RemoteError,
)
from fibercore.rpc import client as rpc_client
from fibercore.rpc import close_to as rpc_close_to
from fibercore.rpc import peek as rpc_peek
from fibercore.runtime import adopt_credentials, credentials_for_child, get_runtime
from fibercore.util import off_thread, start_finalizer_thread, with_traceback
from fibercore.wire import malformed

log = logging.getLogger("fibercore.managers")

CREATE, CALL, INCREF, DECREF, SHUTDOWN = 1, 2, 3, 4, 6  # REPLY (5) and the kinds: fibercore.rpc
PROXY = 2  # a reply kind beside rpc's RETURN and ERROR: the answer is a new shared object


class BY_VALUE:
    """The proxy type of a registered type whose objects are made in the server's own
    synchronization service (fibercore.sync) and returned by value: a handle that talks to
    that service directly."""
#: Threads of a manager server that wait to read requests while others run calls.
SPARE_READERS = 2
#: Most threads reading and running calls at once; beyond it calls queue for the pool.
MAX_READERS = 64


class Token:
    """Identifies a shared object: its type id, its server's address, its id there."""

    __slots__ = ("typeid", "address", "id")

    def __init__(self, typeid: str, address: str, id: int) -> None:
        self.typeid, self.address, self.id = typeid, address, id

    def __getstate__(self) -> tuple[str, str, int]:
        return (self.typeid, self.address, self.id)

    def __setstate__(self, state: tuple[str, str, int]) -> None:
        self.typeid, self.address, self.id = state

    def __repr__(self) -> str:
        return f"{type(self).__name__}(typeid={self.typeid!r}, address={self.address!r}, id={self.id})"


# ------------------------------------------------------------------------------------ server
class _Server:
    """Holds the shared objects and runs calls on them (in the manager's job)."""

    def __init__(self, registry: dict[str, tuple[Any, ...]], key: bytes | None, host: str | None = None,
                 port: int = 0) -> None:
        rt = get_runtime()
        self.serializer = rt.serializer
        self.registry = registry
        self.channel = rt.listen("router", key, host=host, port=port, service="manager")
        self.address = self.channel.address
        self.objects: dict[int, list[Any]] = {}  # id -> [obj, exposed, method_to_typeid, refs]
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        self.pool = ThreadPoolExecutor(max_workers=MAX_READERS, thread_name_prefix="fiber-manager-call")
        self.lanes: dict[tuple[Hashable, int, int], deque[Callable[[], None]]] = {}
        self.stop = threading.Event()
        self.intake = threading.Lock()  # taking a frame and queueing its requests
        self.readers = 1  # threads serving (reading requests, or running one)
        self.idle = 0  # of those, waiting for a request

    def serve_forever(self) -> None:
        """Serve until shutdown. Leader and followers: the thread that reads a request runs
        it (no hand-off between threads), once another thread waits to read the next."""
        self._serve(first=True)

    def _serve(self, first: bool = False) -> None:
        untimed = self.channel.wakeable
        while not self.stop.is_set():
            with self.lock:
                self.idle += 1
            ready: list[tuple[Hashable, int, int]] = []
            # One thread at a time takes a frame and queues its requests, so that requests
            # join their lanes in the order they arrived; running them is parallel.
            with self.intake:
                with self.lock:
                    surplus = not first and self.idle > SPARE_READERS
                try:
                    # A reader sleeps until a request (shutdown closes the channel); one of more
                    # idle threads than SPARE_READERS looks every 0.5 s, and leaves when none came.
                    # (A kept follower that looked every 0.5 s woke the first thread, waiting for
                    # the intake, as often: 16 wake-ups in 4 s of an idle manager.)
                    messages, peer = self.channel.recv(timeout=None if untimed and not surplus else 0.5)
                except TransportError as exc:
                    messages, failure = [], exc
                else:
                    failure = None  # type: ignore[assignment]
                    for op, parts in messages:
                        try:
                            self._handle(op, parts, peer, ready)
                        except Exception as exc:
                            malformed(self.channel.address, peer, op, exc)
            if failure is not None:
                with self.lock:
                    self.idle -= 1
                    leave = isinstance(failure, TransportClosed) or (not first and self.idle >= SPARE_READERS)
                    if leave:
                        self.readers -= 1
                if leave:
                    return
                continue
            with self.lock:
                self.idle -= 1
                spawn = bool(ready) and self.idle == 0 and self.readers < MAX_READERS
                if spawn:
                    self.readers += 1
            if spawn:  # someone must read while this thread runs a call
                threading.Thread(target=self._serve, name="fiber-manager-serve", daemon=True).start()
            if not ready:
                continue
            inline = spawn or self.idle > 0  # else every thread may be busy: keep this one reading
            for lane in ready[:-1] if inline else ready:  # others may block: each on its own thread
                self.pool.submit(self._drain, lane)
            if inline:
                self._drain(ready[-1])
        if first:
            with self.lock:
                self.readers -= 1

    def _handle(self, op: int, parts: list[Any], peer: Hashable, ready: list[tuple[Hashable, int, int]]) -> None:
        """One request; a call whose lane was idle is added to ``ready`` (to run now)."""
        req, ident, thread = REQUEST.unpack(parts[0])
        if op == SHUTDOWN:
            self._reply(peer, req, RETURN, None)  # written to the socket before it closes
            self.stop.set()
            # Wake every serving thread now (a reader waits up to 0.5 s in recv otherwise):
            # shutdown() returns once the job is gone, in milliseconds, as multiprocessing's.
            self.channel.close()
        elif op == INCREF:
            with self.lock:
                if ident in self.objects:
                    self.objects[ident][3] += 1
            self._reply(peer, req, RETURN, None)
        elif op == DECREF:
            with self.lock:
                entry = self.objects.get(ident)
                if entry is not None:
                    entry[3] -= 1
                    if entry[3] <= 0:
                        del self.objects[ident]
        elif op in (CREATE, CALL):
            payload = parts[1:]
            job = (lambda: self._create(peer, req, payload)) if op == CREATE else (
                lambda: self._call(peer, req, ident, payload))
            lane = (peer, thread, ident)
            if self._enqueue(lane, job):
                ready.append(lane)

    def _enqueue(self, lane: tuple[Hashable, int, int], job: Callable[[], None]) -> bool:
        """Queue ``job`` behind earlier jobs of its lane (one object, one thread of one
        client: its calls run in order, while a call that blocks holds up no other thread's);
        True when the lane was idle (the caller runs it: :meth:`_drain`)."""
        with self.lock:
            pending = self.lanes.get(lane)
            if pending is not None:
                pending.append(job)
                return False
            self.lanes[lane] = deque([job])
        return True

    def _drain(self, lane: tuple[Hashable, int, int]) -> None:
        while True:
            with self.lock:
                pending = self.lanes[lane]
                if not pending:
                    del self.lanes[lane]
                    return
                job = pending[0]
            try:
                job()
            finally:
                with self.lock:
                    pending.popleft()

    def _register(self, typeid: str, obj: Any, exposed: Sequence[str] | None,
                  method_to_typeid: dict[str, str] | None) -> tuple[int, tuple[str, ...]]:
        if exposed is None:
            exposed = public_methods(obj)
        ident = next(self.ids)
        with self.lock:
            self.objects[ident] = [obj, tuple(exposed), dict(method_to_typeid or {}), 0]
        return ident, tuple(exposed)

    def _create(self, peer: Hashable, req: int, payload: list[Any]) -> None:
        try:
            typeid, args, kwds = self.serializer.loads(payload)
            factory, exposed, method_to_typeid, proxytype = self.registry[typeid]
            obj = factory(*args, **kwds)
            if proxytype is BY_VALUE:  # a handle to an object of this process's sync service
                self._reply(peer, req, RETURN, obj)
                return
            if exposed is None:
                exposed = getattr(obj, "_exposed_", None)
            self._reply(peer, req, RETURN, self._register(typeid, obj, exposed, method_to_typeid))
        except Exception as exc:
            self._reply(peer, req, ERROR, with_traceback(exc))

    def _call(self, peer: Hashable, req: int, ident: int, payload: list[Any]) -> None:
        try:
            name, args, kwds = self.serializer.loads(payload)
            with self.lock:
                entry = self.objects.get(ident)
            if entry is None:
                raise KeyError(f"shared object {ident} no longer exists on this manager (all its proxies were "
                               "released)")
            obj, exposed, method_to_typeid, _ = entry
            if name == "#getvalue":
                self._reply(peer, req, RETURN, obj)
                return
            if name not in exposed:
                if name in ("__str__", "__repr__"):  # always allowed, as multiprocessing's fallbacks
                    self._reply(peer, req, RETURN, str(obj) if name == "__str__" else repr(obj))
                    return
                raise RemoteError(
                    f"method {name!r} of {type(obj).__name__!r} object is not in the list of allowed "
                    f"methods of its proxy (exposed: {', '.join(exposed) or 'none'}); register the "
                    "type with exposed=(...) to allow it\n")
            result = getattr(obj, name)(*args, **kwds)
        except Exception as exc:
            self._reply(peer, req, ERROR, with_traceback(exc))
            return
        typeid = method_to_typeid.get(name)
        if typeid is None:
            self._reply(peer, req, RETURN, result)
            return
        try:
            _, exposed2, m2t, proxytype = self.registry[typeid]
            if exposed2 is None:
                exposed2 = getattr(result, "_exposed_", None)
            new_id, exposed2 = self._register(typeid, result, exposed2, m2t)
            self._reply(peer, req, PROXY, (typeid, new_id, exposed2, proxytype))
        except Exception as exc:
            self._reply(peer, req, ERROR, with_traceback(exc))

    def _reply(self, peer: Hashable, req: int, kind: int, value: Any) -> None:
        try:
            parts = self.serializer.dumps(value)
        except Exception as exc:
            kind, parts = ERROR, self.serializer.dumps(with_traceback(RemoteError(
                f"the manager could not pickle the result ({type(exc).__name__}: {exc})")))
        try:
            self.channel.send([(REPLY, [HEAD.pack(req, kind), *parts])], peer)
        except TransportError:
            pass  # the client is gone


def public_methods(obj: Any) -> tuple[str, ...]:
    """Names of the public callable attributes of ``obj`` (what an AutoProxy exposes)."""
    return tuple(name for name in dir(obj) if name[0] != "_" and callable(getattr(obj, name, None)))


#: Shortest manager authkey accepted without a warning (the session secret is 32 bytes).
MIN_AUTHKEY = 16
_warned_keys: set[int] = set()


def checked_authkey(authkey: Any) -> bytes | None:
    """A manager's ``authkey`` as bytes (None: the session's secret).

    ``b""`` is refused: it would let anyone connect. A key under :data:`MIN_AUTHKEY` bytes
    is accepted with a :class:`~fibercore.errors.WeakAuthkeyWarning` (once per key):
    multiprocessing's own manager examples use such keys (``b'abracadabra'``), and a
    drop-in runs them; the warning says how easily it is guessed.
    """
    if authkey is None:
        return None
    key = bytes(authkey)
    if not key:
        raise ValueError("authkey=b'' would let any process that reaches the manager's port run code in it: "
                         "leave authkey out (the session's secret is used), or pass os.urandom(32)")
    if len(key) < MIN_AUTHKEY and hash(key) not in _warned_keys:
        _warned_keys.add(hash(key))
        import warnings

        warnings.warn(f"a manager authkey of {len(key)} bytes can be guessed offline by anyone who sees one "
                      f"connection attempt made with it; use {MIN_AUTHKEY} or more random bytes "
                      "(os.urandom(32)), or leave authkey out to use the session's secret",
                      WeakAuthkeyWarning, stacklevel=3)
    return key


def _bind_request(address: Any) -> tuple[str | None, int]:
    """(host, port) a server listens on for a manager ``address``: a (host, port) tuple,
    a ``tcp://host:port`` address or None (the backend's listen host, a port the OS picks)."""
    if address is None:
        return None, 0
    if isinstance(address, tuple) and len(address) == 2:
        return (address[0] or None), int(address[1])
    if isinstance(address, str) and "://" in address:
        where = address.split("://", 1)[1].partition("#")[0].partition("/")[0]
        host, _, port = where.rpartition(":")
        return host.strip("[]"), int(port)
    raise ValueError(f"a manager address is a (host, port) tuple or 'tcp://host:port', not {address!r}")


def _dial_address(address: Any) -> str | None:
    """The transport address to connect to for a manager ``address``."""
    if isinstance(address, tuple):
        host, port = _bind_request(address)
        host = host or "127.0.0.1"
        scheme = "tls+tcp" if get_runtime().config.get("tls") else "tcp"  # the configured scheme, never a downgrade
        return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
    return address


class Server:
    """multiprocessing's ``Server`` API over a fibercore manager server in this process."""

    def __init__(self, registry: dict[str, tuple[Any, ...]], key: bytes | None, host: str | None,
                 port: int) -> None:
        self._server = _Server(registry, key, host, port)
        self.address = self._server.address
        self.listener = self._server.channel  # close() stops accepting, as mp's Listener

    def serve_forever(self) -> None:
        try:
            self._server.serve_forever()
        finally:
            self._server.channel.close()


def _run_server(registry: dict[str, tuple[Any, ...]], key: bytes | None, reply: Any,
                initializer: Callable[..., Any] | None, initargs: tuple[Any, ...],
                host: str | None = None, port: int = 0) -> None:
    """The manager job: build the server, report its address (or why it cannot listen),
    serve until shutdown."""
    if initializer is not None:
        initializer(*initargs)
    try:
        server = _Server(registry, key, host, port)
    except TransportError as exc:  # e.g. the fixed port is taken: the caller raises OSError
        cause = exc.__cause__
        reply.send(("cannot listen", getattr(cause, "errno", None), str(exc)))
        reply.close()
        return
    reply.send(server.address)
    reply.close()
    server.serve_forever()
    server.channel.close()


# ------------------------------------------------------------------------------------ client
def _client(address: str, key: bytes | None) -> Client:
    """This process's connection to the manager server at ``address``."""
    return rpc_client(address, key, f"the manager at {address}")


# ------------------------------------------------------------------------------------ proxies
class BaseProxy:
    """A reference to a shared object in a manager server (``multiprocessing`` semantics)."""

    _exposed_: tuple[str, ...] | None = None
    _method_to_typeid_: dict[str, str] | None = None
    _asynchronous = False

    def __init__(self, token: Token, serializer: str = "fiber", manager: Any = None, authkey: bytes | None = None,
                 exposed: Sequence[str] | None = None, incref: bool = True, manager_owned: bool = False) -> None:
        self._token = token
        self._id = token.id
        self._serializer = serializer
        self._key = checked_authkey(authkey)
        self._manager = manager
        self._exposed = tuple(exposed) if exposed is not None else None
        self._manager_owned = manager_owned
        self._connect(incref)

    def _connect(self, incref: bool) -> None:
        """This process's connection to the server, and (unless owned) its reference."""
        self._client = _client(self._token.address, self._key)
        if incref and not self._manager_owned:
            self._client.request(INCREF, self._id).get()
        if not self._manager_owned:
            # Not at interpreter exit: the server may be gone, and its job ends with ours.
            # Off this thread: a GC pass may run it while this thread holds the client's socket.
            start_finalizer_thread()
            weakref.finalize(self, off_thread, _decref, self._client, self._id).atexit = False

    def _callmethod(self, methodname: str, args: tuple[Any, ...] = (), kwds: dict[str, Any] | None = None) -> Any:
        """Call ``methodname`` on the shared object; the result, or a handle when asynchronous."""
        if self._client.pid != os.getpid():  # in a forked child: its own connection and reference
            self._connect(incref=True)
        args, kwds = tuple(args), dict(kwds or {})
        if self._serializer == "xmlrpclib":
            args, kwds = tuple(_xmlrpc_trip(list(args))), _xmlrpc_trip(kwds)
        future = self._client.request(CALL, self._id, (methodname, args, kwds))
        future._convert = self._convert
        if self._asynchronous:
            return future
        return future.get()

    def _convert(self, answer: tuple[int, Any]) -> Any:
        kind, value = answer
        if kind != PROXY:
            return _xmlrpc_trip(value) if self._serializer == "xmlrpclib" else value
        typeid, ident, exposed, proxytype = value
        token = Token(typeid, self._token.address, ident)
        proxy = (proxytype or AutoProxy)(token, serializer=self._serializer, manager=self._manager,
                                         authkey=self._key, exposed=exposed)
        proxy._asynchronous = self._asynchronous
        return proxy

    def _getvalue(self) -> Any:
        """A copy of the referent."""
        return self._callmethod("#getvalue")

    def __reduce__(self) -> Any:
        # Keep the object alive for the copy in flight; the copy adopts this reference.
        if self._client.pid != os.getpid():
            self._connect(incref=True)
        self._client.request(INCREF, self._id).get()
        key = self._key if self._key != get_runtime().secret else None
        return (_rebuild_proxy, (type(self), self._token, key, self._exposed, credentials_for_child(),
                                 self._serializer))

    def __deepcopy__(self, memo: Any) -> Any:
        return self._getvalue()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} object, typeid {self._token.typeid!r} at {id(self):#x}>"

    def __str__(self) -> str:
        try:
            return self._callmethod("__repr__")
        except Exception:
            return repr(self)[:-1] + "; '__str__()' failed>"


def _decref(client: Client, ident: int) -> None:
    if not client.closed and client.pid == os.getpid():
        try:
            client.request(DECREF, ident, reply=False)
        except Exception:
            pass


def _rebuild_proxy(cls: type[BaseProxy], token: Token, key: bytes | None, exposed: Any,
                   credentials: tuple[str, bytes] | None = None, serializer: str = "fiber") -> BaseProxy:
    adopt_credentials(credentials)
    return cls(token, serializer=serializer, authkey=key, exposed=exposed, incref=False)


SERIALIZERS = ("fiber", "pickle", "xmlrpclib")


def _xmlrpc_trip(value: Any) -> Any:
    """What ``value`` becomes through XML-RPC, as with multiprocessing's ``serializer="xmlrpclib"``
    (tuples arrive as lists; only XML-RPC's types pass)."""
    import xmlrpc.client

    params, _ = xmlrpc.client.loads(xmlrpc.client.dumps((value,), allow_none=True), use_builtin_types=True)
    return params[0]


def MakeProxyType(name: str, exposed: Sequence[str], _cache: dict[Any, type] = {}) -> type:  # noqa: B006
    """A BaseProxy subclass whose methods call the exposed methods of the referent."""
    exposed = tuple(exposed)
    try:
        return _cache[(name, exposed)]
    except KeyError:
        pass
    namespace: dict[str, Any] = {}
    for meth in exposed:
        def method(self: BaseProxy, *args: Any, _name: str = meth, **kwds: Any) -> Any:
            return self._callmethod(_name, args, kwds)
        method.__name__ = meth
        namespace[meth] = method
    proxytype = type(name, (BaseProxy,), namespace)
    proxytype._exposed_ = exposed  # type: ignore[attr-defined]
    _cache[(name, exposed)] = proxytype
    return proxytype


def AutoProxy(token: Token, serializer: str = "fiber", manager: Any = None, authkey: bytes | None = None,
              exposed: Sequence[str] | None = None, incref: bool = True, manager_owned: bool = False) -> BaseProxy:
    """A proxy exposing the referent's public methods (or ``exposed``)."""
    if exposed is None:
        exposed = ()
    proxytype = MakeProxyType(f"AutoProxy[{token.typeid}]", exposed)
    return proxytype(token, serializer=serializer, manager=manager, authkey=authkey, exposed=exposed,
                     incref=incref, manager_owned=manager_owned)


class IteratorProxy(BaseProxy):
    _exposed_ = ("__next__", "send", "throw", "close")

    def __iter__(self) -> IteratorProxy:
        return self

    def __next__(self, *args: Any) -> Any:
        return self._callmethod("__next__", args)

    def send(self, *args: Any) -> Any:
        return self._callmethod("send", args)


class NamespaceProxy(BaseProxy):
    _exposed_ = ("__getattribute__", "__setattr__", "__delattr__")

    def __getattr__(self, key: str) -> Any:
        if key[0] == "_":
            return object.__getattribute__(self, key)
        return object.__getattribute__(self, "_callmethod")("__getattribute__", (key,))

    def __setattr__(self, key: str, value: Any) -> None:
        if key[0] == "_":
            object.__setattr__(self, key, value)
            return
        object.__getattribute__(self, "_callmethod")("__setattr__", (key, value))

    def __delattr__(self, key: str) -> None:
        if key[0] == "_":
            object.__delattr__(self, key)
            return
        object.__getattribute__(self, "_callmethod")("__delattr__", (key,))


class ValueProxy(BaseProxy):
    _exposed_ = ("get", "set")

    def get(self) -> Any:
        return self._callmethod("get")

    def set(self, value: Any) -> None:
        self._callmethod("set", (value,))

    value = property(get, set)


_LIST_METHODS = ("__add__", "__contains__", "__delitem__", "__getitem__", "__len__", "__mul__",
                 "__reversed__", "__rmul__", "__setitem__", "append", "count", "extend", "index",
                 "insert", "pop", "remove", "reverse", "sort", "__imul__")
BaseListProxy = MakeProxyType("BaseListProxy", _LIST_METHODS)


class ListProxy(BaseListProxy):  # type: ignore[misc, valid-type]
    def __iadd__(self, value: Any) -> ListProxy:
        self._callmethod("extend", (value,))
        return self

    def __imul__(self, value: Any) -> ListProxy:
        self._callmethod("__imul__", (value,))
        return self


_DICT_METHODS = ("__contains__", "__delitem__", "__getitem__", "__iter__", "__len__", "__setitem__",
                 "clear", "copy", "get", "items", "keys", "pop", "popitem", "setdefault", "update", "values")
DictProxy = MakeProxyType("DictProxy", _DICT_METHODS)
DictProxy._method_to_typeid_ = {"__iter__": "Iterator"}  # type: ignore[attr-defined]
ArrayProxy = MakeProxyType("ArrayProxy", ("__len__", "__getitem__", "__setitem__"))


class Namespace:
    """A plain attribute bag, shared through ``SyncManager.Namespace()``."""

    def __init__(self, **kwds: Any) -> None:
        self.__dict__.update(kwds)

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(self.__dict__.items()) if not k.startswith("_"))
        return f"Namespace({items})"


class Value:
    """A boxed value (``SyncManager.Value``): a proxy target, not shared memory."""

    def __init__(self, typecode: Any, value: Any, lock: bool = True) -> None:
        self._typecode = typecode
        self._value = value

    def get(self) -> Any:
        return self._value

    def set(self, value: Any) -> None:
        self._value = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._typecode!r}, {self._value!r})"

    value = property(get, set)


def Array(typecode: str, sequence: Any, lock: bool = True) -> array.array:
    return array.array(typecode, sequence)


# ------------------------------------------------------------------------------------ managers
class BaseManager:
    """Start a manager server as a job (``start``) or join one (``connect``); create shared objects."""

    _registry: dict[str, tuple[Any, ...]] = {}
    _asynchronous = False

    def __init__(self, address: str | None = None, authkey: bytes | None = None, serializer: str = "fiber",
                 ctx: Any = None, *, shutdown_timeout: float = 1.0) -> None:
        if serializer not in SERIALIZERS:
            raise ValueError(f"unknown serializer {serializer!r}: use one of {', '.join(SERIALIZERS)} "
                             "('pickle' and 'fiber' are the same: cloudpickle)")
        self._serializer = serializer
        self._requested = _bind_request(address)  # where start()/get_server() listen
        self._address = _dial_address(address)
        self._authkey = checked_authkey(authkey)
        self._process: Any = None
        self._state = "initial"
        self._shutdown_timeout = shutdown_timeout

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self, initializer: Callable[..., Any] | None = None, initargs: Sequence[Any] = ()) -> None:
        """Run the server as a job on the selected backend and wait for its address."""
        from fibercore import Pipe, Process

        if self._state != "initial":
            raise ProcessError(f"cannot start a manager that is {self._state}")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        reader, writer = Pipe(duplex=False)
        self._process = Process(
            target=_run_server,
            args=(dict(self._registry), self._authkey, writer, initializer, tuple(initargs), *self._requested),
            name=type(self).__name__ + "-server",
        )
        self._process.start()
        writer.close()
        timeout = float(get_runtime().config.get("start_timeout"))
        if not reader.poll(timeout):
            self._process.kill()
            raise ProcessError(f"the manager server did not report its address within {timeout:.0f} s; "
                               f"its logs:\n{self._process.logs()}")
        try:
            answer = reader.recv()
            if isinstance(answer, tuple):  # the server could not listen where it was asked to
                self._process.join(5)
                raise OSError(answer[1] or 0, f"the manager server cannot listen on {self._requested}: {answer[2]}")
            self._address = answer
        except EOFError:
            self._process.join(5)
            raise ProcessError(
                f"the manager server exited ({self._process.exitcode}) before it was ready; its logs:\n"
                f"{self._process.logs()}") from None
        finally:
            reader.close()
        self._state = "started"
        liveness.on_lost(self._server_lost)
        # As multiprocessing: a manager nobody shuts down stops when collected or at exit.
        self._finalizer = lifetime.track(
            self, functools.partial(_stop_server, self._process, self._address, self._authkey,
                                    self._shutdown_timeout),
            lifetime.MANAGER)
        registry.track_manager(self)

    def _server_lost(self, host: str, pid: int, machine: str) -> None:
        """The server's job was declared lost (silent past ``heartbeat_timeout``): this
        process's calls to it raise now instead of waiting on the network."""
        popen = getattr(self._process, "_popen", None)
        where = getattr(popen, "where", None)
        if where is None or not liveness.same_job(where, host, pid, machine) or self._address is None:
            return
        self._state = "lost"
        rpc_close_to(self._address, ProcessError(
            f"the manager's server on {host} (pid {pid}) was declared lost: silent past heartbeat_timeout "
            "(its host partitioned, frozen or gone); start a new manager"))

    def _view(self) -> dict[str, Any]:
        """What ``fiber top`` and the dashboard show of this manager (:mod:`fibercore.observe`)."""
        process = getattr(self, "_process", None)
        return {"kind": type(self).__name__, "address": str(self._address), "state": self._state,
                "process": process.name if process is not None else None,
                "pid": process.pid if process is not None else None}

    def connect(self, timeout: float = 10.0) -> None:
        """Use the running server at ``address`` (given to the constructor).

        Raises AuthenticationError when no authenticated answer comes back (another
        ``authkey``, or not a fibercore manager at that address).
        """
        if self._address is None:
            raise ValueError("connect() needs the address of a running manager: BaseManager(address=...)")
        client = _client(self._address, self._authkey)
        try:
            client.request(INCREF, 0).get(timeout)  # a no-op round trip: proves both sides share the key
        except TimeoutError:
            client.close(AuthenticationError("not authenticated"))
            raise AuthenticationError(
                f"no authenticated answer from the manager at {self._address} within {timeout:.0f} s: it "
                "uses another authkey (or session), or is not a fibercore manager. Pass the authkey the "
                "manager was created with."
            ) from None
        self._state = "connected"

    def get_server(self) -> Server:
        """A server in this process on the manager's address (``serve_forever()`` runs it);
        ``start()`` runs one as a job instead."""
        if self._state != "initial":
            raise ProcessError(f"cannot make a server for a manager that is {self._state}")
        return Server(dict(self._registry), self._authkey, *self._requested)

    def shutdown(self) -> None:
        """Stop the server (and its job) if this manager started it."""
        if self._state in ("started", "lost") and self._address is not None:
            self._finalizer.cancel()
            _stop_server(self._process, self._address, self._authkey, self._shutdown_timeout)
        self._state = "shutdown"

    def join(self, timeout: float | None = None) -> None:
        if self._process is not None:
            self._process.join(timeout)

    def __enter__(self) -> BaseManager:
        if self._state == "initial":
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @property
    def address(self) -> str | None:
        return self._address

    @property
    def authkey(self) -> bytes:
        return self._authkey or get_runtime().secret

    # -- creating shared objects -----------------------------------------------------------------
    def _create(self, typeid: str, *args: Any, **kwds: Any) -> BaseProxy:
        if self._state == "initial":
            # The original fiber's examples create objects without start(): start (or
            # connect to ``address``) on first use.
            self.start() if self._address is None else self.connect()
        if self._state not in ("started", "connected"):
            raise ProcessError(f"the manager is {self._state}: create a new manager and start() it")
        _, exposed, _m2t, proxytype = self._registry[typeid]
        client = _client(self._address, self._authkey)  # type: ignore[arg-type]
        if proxytype is BY_VALUE:  # the server made it in its sync service: here is its handle
            return client.request(CREATE, 0, (typeid, args, kwds)).get()
        ident, exposed = client.request(CREATE, 0, (typeid, args, kwds)).get()
        token = Token(typeid, self._address, ident)  # type: ignore[arg-type]
        proxy = (proxytype or AutoProxy)(token, serializer=self._serializer, manager=self,
                                         authkey=self._authkey, exposed=exposed)
        if self._asynchronous:
            proxy._asynchronous = True
        return proxy

    @classmethod
    def register(cls, typeid: str, callable: Callable[..., Any] | None = None, proxytype: Any = None,
                 exposed: Sequence[str] | None = None, method_to_typeid: dict[str, str] | None = None,
                 create_method: bool = True) -> None:
        """Register a type (a factory) that managers of this class can create and serve."""
        if "_registry" not in cls.__dict__:
            cls._registry = dict(cls._registry)
        if proxytype is None:
            proxytype = AutoProxy
        if proxytype is BY_VALUE:
            exposed = ()
        exposed = exposed or getattr(proxytype, "_exposed_", None)
        method_to_typeid = method_to_typeid or getattr(proxytype, "_method_to_typeid_", None)
        if method_to_typeid:
            for key, value in method_to_typeid.items():
                assert type(key) is str and type(value) is str, f"{key!r} -> {value!r} is not str -> str"
        cls._registry[typeid] = (callable, exposed, method_to_typeid, proxytype)
        if create_method:
            def temp(self: BaseManager, *args: Any, **kwds: Any) -> Any:
                return self._create(typeid, *args, **kwds)
            temp.__name__ = typeid
            setattr(cls, typeid, temp)


def _stop_server(process: Any, address: str, key: bytes | None, timeout: float) -> None:
    """Ask the server to stop, wait ``timeout`` (+5 s) for its job, then terminate it."""
    try:
        _client(address, key).request(SHUTDOWN, 0).get(timeout + 5)
    except Exception:
        pass
    client = rpc_peek(address, key)
    if client is not None:
        client.close(ProcessError(f"the manager at {address} was shut down"))
    if process is not None:
        process.join(timeout + 5)
        if process.is_alive():
            process.terminate()
            process.join(5)


class SyncManager(BaseManager):
    """``dict``, ``list``, ``Namespace``, ``Queue``, ``JoinableQueue``, ``Value``, ``Array``... as proxies."""


SyncManager.register("Queue", queue.Queue)
SyncManager.register("JoinableQueue", queue.Queue)
SyncManager.register("dict", dict, DictProxy)
SyncManager.register("list", list, ListProxy)
SyncManager.register("Namespace", Namespace, NamespaceProxy)
SyncManager.register("Value", Value, ValueProxy)
SyncManager.register("Array", Array, ArrayProxy)
SyncManager.register("Iterator", proxytype=IteratorProxy, create_method=False)


class _ManagedHandle:
    """A fibercore.sync handle made by a manager: it lives in the manager's process (and
    goes with it), and calls that process's sync service directly (no manager thread
    blocks on an acquire). Named as multiprocessing names the proxies."""

    _typeid = ""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} object, typeid {self._typeid!r} at {id(self):#x}>"


class LockProxy(_ManagedHandle, sync.Lock):
    _typeid = "Lock"


class RLockProxy(_ManagedHandle, sync.RLock):
    _typeid = "RLock"


class SemaphoreProxy(_ManagedHandle, sync.Semaphore):
    _typeid = "Semaphore"


class BoundedSemaphoreProxy(_ManagedHandle, sync.BoundedSemaphore):
    _typeid = "BoundedSemaphore"


class ConditionProxy(_ManagedHandle, sync.Condition):
    _typeid = "Condition"


class EventProxy(_ManagedHandle, sync.Event):
    _typeid = "Event"


class BarrierProxy(_ManagedHandle, sync.Barrier):
    _typeid = "Barrier"


for _handle in (LockProxy, RLockProxy, SemaphoreProxy, BoundedSemaphoreProxy, ConditionProxy, EventProxy,
                BarrierProxy):
    SyncManager.register(_handle._typeid, _handle, BY_VALUE)


class AsyncManager(SyncManager):
    """Like SyncManager, but each proxy method call returns a handle at once.

    ``handle.get(timeout)`` gives that call's result (or raises its remote
    exception), in whatever order handles are collected; ``ready()`` and ``wait()``
    as on an AsyncResult. Calls on one object run in the order they were made.
    """

    _asynchronous = True


__all__ = [
    "Array",
    "AsyncManager",
    "AutoProxy",
    "BarrierProxy",
    "BaseListProxy",
    "BaseManager",
    "BaseProxy",
    "BoundedSemaphoreProxy",
    "ConditionProxy",
    "DictProxy",
    "EventProxy",
    "Future",
    "IteratorProxy",
    "ListProxy",
    "LockProxy",
    "MakeProxyType",
    "Namespace",
    "NamespaceProxy",
    "RLockProxy",
    "RemoteError",
    "SemaphoreProxy",
    "SyncManager",
    "Token",
    "Value",
    "ValueProxy",
    "public_methods",
]
