"""Request and reply over one connection per process and server, read by whoever waits.

Used by managers (:mod:`fibercore.managers`) and the synchronization service
(:mod:`fibercore.sync`). Request: ``[u64 request id, u64 object id, u64 calling
thread] + pickle``; reply: op ``REPLY``, ``[u64 request id, u64 kind] + pickle``, kind
RETURN, ERROR (the value is the exception to raise) or a server's own kind (a manager's
PROXY). A client has no thread of its own: the first thread waiting for an answer reads
the connection and hands every answer to its :class:`Future`.
"""

from __future__ import annotations

import itertools
import multiprocessing.managers
import os
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from fibercore import lifetime
from fibercore.errors import ProcessError, TransportClosed, TransportError, TransportTimeout
from fibercore.results import ApplyResult
from fibercore.runtime import get_runtime

REPLY = 5
RETURN, ERROR = 0, 1
HEAD = struct.Struct("<QQ")  # a reply: request id, kind
REQUEST = struct.Struct("<QQQ")  # request id, object id, the calling thread


class RemoteError(ProcessError, multiprocessing.managers.RemoteError):
    """An error in a server: a method its proxy does not expose, or an exception that
    could not be sent as itself (``multiprocessing.managers.RemoteError`` too)."""


class Future(ApplyResult):
    """The handle of one call, an :class:`~fibercore.pool.ApplyResult` (``get(timeout)``,
    ``ready()``, ``wait(timeout)``, ``successful()``) whose waiting reads the answer off
    the server's connection itself (whoever waits reads for every waiter; no reader thread)."""

    def __init__(self, client: Client | None = None) -> None:
        super().__init__()
        self._kind = RETURN
        self._convert: Callable[[Any], Any] | None = None
        self._client = client  # whose connection carries the answer (read by whoever waits)
        self.req = 0
        #: Set when its caller stopped waiting (:meth:`Client.abandon`): runs on the late answer.
        self.late: Callable[[int, Any], None] | None = None

    def _answer(self, kind: int, value: Any) -> None:
        """The server's answer: RETURN or ERROR (raised by get), or another kind ``_convert`` reads."""
        self._kind = kind
        self._set(0, kind != ERROR, value)

    def ready(self) -> bool:
        if not self._event.is_set() and self._client is not None:
            self._client.wait_for(self, 0)
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:  # type: ignore[override]
        """Wait for the answer; True once it is there (as ``threading.Event.wait``)."""
        if self._client is not None:
            return self._client.wait_for(self, timeout)
        return self._event.wait(timeout)

    def get(self, timeout: float | None = None) -> Any:
        value = super().get(timeout)
        if self._convert is not None:
            return self._convert((self._kind, value))
        return value


class Client:
    """This process's connection to one server; every handle of that server shares it."""

    def __init__(self, address: str, key: bytes | None, what: str | None = None, service: str = "manager") -> None:
        rt = get_runtime()
        self.serializer = rt.serializer
        self.address = address
        #: How errors name the server ("the manager at tcp://...").
        self.what = what or f"the server at {address}"
        self.pid = os.getpid()
        self.channel = rt.dial("router", address, key, service=service)
        self.ids = itertools.count(1)
        self.waiting: dict[int, Future] = {}
        self.lock = threading.Lock()
        self.closed = False
        self.gone = f"{self.what} is gone (shut down or its process ended)"  # what later calls say
        self.reading = threading.Lock()  # held by the one thread that reads answers for all
        self.channel.on_peer_event(self._peer_event)

    def _peer_event(self, peer: object, added: bool) -> None:
        if not added:  # the server is gone: fail waiting calls, never block on it again
            self.close(ProcessError(f"{self.what} went away (shut down or its process ended)"))

    def close(self, exc: BaseException) -> None:
        if not self.closed:
            self.gone = str(exc)
        self.closed = True
        self._fail_all(exc)
        self.channel.close()
        forget(self)

    def wait_for(self, future: Future, timeout: float | None) -> bool:
        """Wait until ``future`` has its answer; False after ``timeout``.

        No thread of its own: the first waiting thread reads the connection and hands
        every answer to its future (its own ends its wait at once, with no hand-off);
        the others wait for theirs, or to take over reading when it leaves.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while not future._event.is_set():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0 and timeout != 0:
                return False
            if self.reading.acquire(blocking=False):
                try:
                    self._read_until(future, deadline)
                finally:
                    self.reading.release()
                if timeout == 0 or (deadline is not None and time.monotonic() >= deadline):
                    return future._event.is_set()
            elif timeout == 0:
                return False
            else:  # another thread reads: our answer comes through it, or we take over
                future._event.wait(FOLLOWER_STEP if remaining is None else min(FOLLOWER_STEP, remaining))
        return True

    def _read_until(self, future: Future, deadline: float | None) -> None:
        while not future._event.is_set():
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                messages, _ = self.channel.recv(remaining)
            except TransportTimeout:
                return
            except TransportClosed:
                self._fail_all(ProcessError(f"the connection to {self.what} closed"))
                return
            self._answer(messages)

    def _answer(self, messages: list[tuple[int, list[Any]]]) -> None:
        for op, parts in messages:
            if op != REPLY:
                continue
            req, kind = HEAD.unpack(parts[0])
            with self.lock:
                future = self.waiting.pop(req, None)
            if future is None:
                continue
            try:
                value = self.serializer.loads(parts[1:])
            except Exception as exc:
                kind, value = ERROR, RemoteError(f"cannot unpickle the answer of {self.what}: {exc}")
            future._answer(kind, value)
            if future.late is not None:
                future.late(kind, value)

    def abandon(self, future: Future, late: Callable[[int, Any], None]) -> bool:
        """Stop waiting for ``future`` (its server does not answer): ``late`` gets the answer
        if it ever comes. False when the answer is already being delivered (wait for it)."""
        with self.lock:
            if future.req not in self.waiting:
                return False
            future.late = late
            return True

    def _fail_all(self, exc: BaseException) -> None:
        with self.lock:
            waiting, self.waiting = self.waiting, {}
        for future in waiting.values():
            future._answer(ERROR, exc)

    def request(self, op: int, ident: int, value: Any = None, reply: bool = True) -> Future:
        """Send ``value`` (pickled) as request ``op`` about object ``ident``; the answer's
        Future (``future.req`` is the request id)."""
        future = Future(self if reply else None)
        if self.closed:
            future._answer(ERROR, ProcessError(self.gone))
            return future
        req = future.req = next(self.ids)
        if reply:
            with self.lock:
                self.waiting[req] = future
        parts = self.serializer.dumps(value)
        try:
            self.channel.send([(op, [REQUEST.pack(req, ident, threading.get_ident()), *parts])])
        except TransportError as exc:
            with self.lock:
                self.waiting.pop(req, None)
            future._answer(ERROR, ProcessError(f"cannot reach {self.what}: {exc}"))
        if not reply:
            future._answer(RETURN, None)
        return future


#: Seconds a thread waiting for an answer that another thread reads checks whether to take over.
FOLLOWER_STEP = 0.005

_clients: lifetime.PerProcess[tuple[str, bytes | None], Client] = lifetime.PerProcess()  # by (address, authkey)


#: Servers this process was told are lost (their job declared lost), with why: never dialled again.
_lost: dict[str, str] = {}


def client(address: str, key: bytes | None, what: str | None = None, service: str = "manager") -> Client:
    """This process's connection to the ``service`` server at ``address`` (made on first use)."""
    found = _clients.peek((address, key))  # every call asks: no closure made on that path
    if found is not None:
        return found
    if address in _lost:
        raise ProcessError(_lost[address])
    return _clients.get((address, key), lambda: Client(address, key, what, service))


def forget(found: Client) -> None:
    """Drop a closed client from the cache."""
    _clients.discard(found)


def close_to(address: str, exc: BaseException) -> None:
    """Close this process's connections to the server at ``address`` (it was declared lost):
    waiting calls raise ``exc``, later ones (new proxies too) say it is gone, never dial it."""
    _lost[address] = str(exc)
    for found in _clients.here():
        if found.address == address and not found.closed:
            found.close(exc)


def peek(address: str, key: bytes | None) -> Client | None:
    """This process's connection to ``address`` if it has one."""
    return _clients.peek((address, key))


__all__ = ["Client", "Future", "RemoteError", "client"]
