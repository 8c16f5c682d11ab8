"""The synchronization service: one per process that creates shared primitives or values.

::

    any process                         the creating process
    lock.acquire() ─ CALL(acquire) ─▶  SyncService thread ─ state machine ─▶ REPLY (now,
                    (rpc.Client)        (fibercore.sync.states)                 or when granted)
                 ◀───────────── REPLY ─┘
    a timeout:   ─ CANCEL(request) ─▶  answers the parked request (unless it was granted)

* One listener and one thread per service; every object of the process lives in it,
  as a state machine (:mod:`fibercore.sync.states`). A blocking call costs no thread:
  its request is *parked* and answered when it is granted, so a thousand waiters are
  a thousand small records.
* Calls from the creating process itself go to the states directly (no socket).
* Requests and replies use :mod:`fibercore.rpc`'s format: the caller's thread id is in
  every request, so an RLock knows its owner across processes.
* A process whose connection closes is lost: its locks are released and marked
  abandoned, its waiters dropped, its barriers broken unless it said goodbye (BYE, sent
  by every process at exit). That is the failure model: the connection ends as soon as
  the process dies (its kernel closes it); a lost machine is noticed by TCP keepalive
  (after ``heartbeat_timeout``).
* An object lives while its creating process holds a handle to it, or for the life of
  the service once a handle has been sent to another process.
* No peer can stall the service: a small answer goes out at once when its connection
  has room; a big one, or any while some wait, goes into that peer's outbox, sent by a
  thread of its own. A peer that reads nothing for :data:`STUCK_AFTER` seconds, or lets
  :data:`OUTBOX_BYTES` pile up, is dropped (as if it died: its locks are released as
  abandoned). One peer may park at most :data:`MAX_PARKED_PER_PEER` requests.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from fibercore import liveness
from fibercore.errors import ProcessError, TransportClosed, TransportError
from fibercore.rpc import HEAD, REPLY, REQUEST
from fibercore.runtime import get_runtime
from fibercore.sync.states import ERROR, PARKED, RETURN, State, Waiter
from fibercore.util import with_traceback
from fibercore.wire import malformed
from fibercore.wire.outbox import Outboxes

log = logging.getLogger("fibercore.sync")

CALL, CANCEL, HELLO, BYE = 2, 7, 8, 9
#: The peer of calls made in the service's own process.
LOCAL = "local"
#: Seconds a peer may leave its connection full (answers waiting) before it is dropped.
STUCK_AFTER = 30.0
#: Bytes of answers that may wait for one peer before it is dropped.
OUTBOX_BYTES = 512 << 20
#: Answers up to this size are sent from the service thread when the connection has room.
INLINE_BYTES = 64 << 10
#: Requests one peer may have parked (waiting for a lock, an event...) at once.
MAX_PARKED_PER_PEER = 10_000


class Ref:
    """An argument naming another object of the same service (a Value's lock)."""

    __slots__ = ("oid",)

    def __init__(self, oid: int) -> None:
        self.oid = oid

    def __reduce__(self) -> Any:
        return (Ref, (self.oid,))


class SyncService:
    """Holds this process's shared objects and answers every request for them."""

    def __init__(self) -> None:
        rt = get_runtime()
        self.serializer = rt.serializer
        self.channel = rt.listen("router", service="sync")
        self.address = self.channel.address
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.objects: dict[int, State] = {}
        self.pinned: set[int] = set()  # sent to another process: kept for the service's life
        # Releases that found the lock taken: a handle's finalizer can run (by garbage
        # collection) inside any locked section of this very thread, where taking the lock
        # again would deadlock. They are applied the next time the lock is free.
        self.released: collections.deque[int] = collections.deque()
        self.ids = itertools.count(1)
        self.parked: dict[tuple[Hashable, int], Waiter] = {}  # (peer, request) -> waiter
        self.names: dict[Hashable, str] = {}  # peer -> "Process-3 (pid 41 on node-7)"
        self.origins: dict[Hashable, tuple[str, int, str]] = {}  # peer -> (host, pid, machine) it said
        self.leaving: set[Hashable] = set()  # peers that said BYE
        self._outbox: list[tuple[Hashable, int, int, Any]] = []
        # Peers whose answers wait for room, each with a sending thread of its own.
        self.slow = Outboxes(self.channel, "synchronization service", OUTBOX_BYTES, self.channel.wake,
                             lambda peer: self.names.get(peer, repr(peer)))
        self._parked_by: collections.Counter[Hashable] = collections.Counter()
        self._local_ids = itertools.count(1)
        self._timers: list[tuple[float, int, Callable[[], None]]] = []  # (when, order, fn): a heap
        self._timers_cv = threading.Condition()
        self._timer_ids = itertools.count()
        self._timer_thread: threading.Thread | None = None
        self.channel.on_peer_event(self._peer_event)
        liveness.on_lost(self._job_lost)
        threading.Thread(target=self._serve, name="fiber-sync", daemon=True).start()

    def _job_lost(self, host: str, pid: int, machine: str) -> None:
        """A job was declared lost: drop its connections now, as if it had died (its parked
        calls end, its locks go, a ParameterServer round stops waiting for it)."""
        with self.lock:
            peers = [peer for peer, origin in self.origins.items() if liveness.same_job(origin, host, pid, machine)]
        for peer in peers:
            self.channel.drop(peer)

    # -- objects ------------------------------------------------------------------------------
    def add(self, state: State) -> int:
        with self.lock:
            self._forget_released()
            oid = next(self.ids)
            self.objects[oid] = state
        return oid

    def view(self, limit: int = 500) -> list[dict[str, Any]]:
        """The shared objects held here, for ``fiber top`` and the dashboard (at most ``limit``)."""
        with self.lock:
            held = list(itertools.islice(self.objects.items(), limit))
        return [{"id": oid, "kind": state.kind, "state": state.describe()} for oid, state in held]

    def get(self, oid: int) -> State:
        state = self.objects.get(oid)
        if state is None:
            raise ReferenceError(
                f"shared object {oid} no longer exists in the process that created it (pid "
                f"{self.pid}): it was released there; keep the object referenced in its creating "
                "process while other processes use it")
        return state

    def pin(self, oid: int) -> None:
        self.pinned.add(oid)

    def release(self, oid: int) -> None:
        """The creating process dropped its last handle: forget the object unless it was sent
        away. Never waits for the lock (this may run in a finalizer, inside a locked section)."""
        self.released.append(oid)
        if self.lock.acquire(blocking=False):
            try:
                self._forget_released()
            finally:
                self.lock.release()

    def _forget_released(self) -> None:
        """Apply the releases queued so far (lock held)."""
        while self.released:
            oid = self.released.popleft()
            if oid not in self.pinned:
                self.objects.pop(oid, None)

    def call_later(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` under the service's lock after ``delay`` seconds (a state's time limit);
        the answers it gives are sent at once. One timer thread serves every call."""
        with self._timers_cv:
            heapq.heappush(self._timers, (time.monotonic() + max(0.0, delay), next(self._timer_ids), fn))
            if self._timer_thread is None:
                self._timer_thread = threading.Thread(target=self._run_timers, name="fiber-sync-timers",
                                                      daemon=True)
                self._timer_thread.start()
            self._timers_cv.notify()

    def _run_timers(self) -> None:
        while True:
            with self._timers_cv:
                while not self._timers or self._timers[0][0] > time.monotonic():
                    self._timers_cv.wait(None if not self._timers else self._timers[0][0] - time.monotonic())
                _, _, fn = heapq.heappop(self._timers)
            with self.lock:
                try:
                    fn()
                except Exception:
                    log.exception("sync service: a timed operation failed")
            self._flush()

    def name_of(self, peer: Hashable) -> str:
        """How a connected process introduced itself ("Process-3 (pid 41 on node-7)")."""
        return "this process" if peer == LOCAL else self.names.get(peer, f"a process connected as {peer!r}")

    # -- calls ----------------------------------------------------------------------------------
    def _invoke(self, w: Waiter, oid: int, method: str, args: tuple[Any, ...]) -> Any:
        """Run ``method`` of object ``oid`` for waiter ``w`` (lock held): its answer or PARKED."""
        state = self.get(oid)
        fn: Callable[..., Any] | None = getattr(state, "op_" + method, None)
        if fn is None:
            raise AttributeError(f"a shared {state.kind} has no operation {method!r}")
        args = tuple(self.get(a.oid) if isinstance(a, Ref) else a for a in args)
        return fn(w, *args)

    def call_local(self, oid: int, method: str, args: tuple[Any, ...], timeout: float | None) -> Any:
        """A call from this process: straight to the state; waits here when it parks."""
        w = Waiter((LOCAL, threading.get_ident()), _unset)
        try:
            with self.lock:
                self._forget_released()
                answer = self._invoke(w, oid, method, args)
                if answer is PARKED:  # answered later, by another thread: wait for it here
                    done = threading.Event()
                    box: list[tuple[int, Any]] = []
                    w.answer = lambda kind, value: (box.append((kind, value)), done.set())  # type: ignore[func-returns-value,assignment]
        finally:
            if self._outbox:
                self._flush()
        if answer is not PARKED:
            return answer
        if not done.wait(timeout):
            with self.lock:
                if not w.done and w.state is not None:
                    w.state.cancel(w)
            if self._outbox:
                self._flush()
            done.wait()  # the final answer (a Condition waiter first takes its lock back)
        kind, value = box[0]
        if kind == ERROR:
            raise value
        return value

    # -- the service thread -------------------------------------------------------------------------
    def _serve(self) -> None:
        checked = time.monotonic()
        # Idle, it sleeps until a request comes (where the transport can be woken: a slow
        # peer's outbox, made by another thread, wakes it to watch that peer every second).
        untimed = self.channel.wakeable
        while True:
            if self.slow.any() and time.monotonic() - checked > 1.0:
                checked = time.monotonic()
                self.slow.check_stuck(STUCK_AFTER)
            try:
                messages, peer = self.channel.recv(None if untimed and not self.slow.any() else 1.0)
            except TransportClosed:
                return
            except TransportError:
                continue
            with self.lock:
                for op, parts in messages:
                    try:
                        self._handle(op, parts, peer)
                    except Exception as exc:  # authentic but malformed
                        malformed(self.address, peer, op, exc)
            self._flush()

    def _handle(self, op: int, parts: list[Any], peer: Hashable) -> None:
        """One request (lock held)."""
        req, oid, thread = REQUEST.unpack(parts[0])
        if op == CALL:
            method, args = self.serializer.loads(parts[1:])
            key = (peer, req)
            w = Waiter((peer, thread), lambda kind, value: self._reply(key, kind, value))
            try:
                if self._parked_by[peer] >= MAX_PARKED_PER_PEER:  # each thread parks one: a flood
                    raise ProcessError(
                        f"{self.names.get(peer, peer)} has {MAX_PARKED_PER_PEER} calls waiting in the "
                        f"synchronization service of pid {self.pid} already; refused")
                answer = self._invoke(w, oid, method, args)
            except Exception as exc:
                w.finish(ERROR, with_traceback(exc))
            else:
                if answer is PARKED:
                    self.parked[key] = w
                    self._parked_by[peer] += 1
                else:
                    w.finish(RETURN, answer)
        elif op == CANCEL:
            target = self.serializer.loads(parts[1:])
            parked = self.parked.get((peer, target))
            if parked is not None and parked.state is not None:
                parked.state.cancel(parked)
        elif op == HELLO:
            info = self.serializer.loads(parts[1:])
            self.names[peer] = f"{info.get('name', '?')} (pid {info.get('pid', '?')} on {info.get('host', '?')})"
            try:
                self.origins[peer] = (str(info["host"]), int(info["pid"]), str(info.get("machine") or ""))
            except (KeyError, TypeError, ValueError):
                pass
        elif op == BYE:
            self.leaving.add(peer)

    def _reply(self, key: tuple[Hashable, int], kind: int, value: Any) -> None:
        """Queue the answer to remote request ``key`` (lock held; sent by :meth:`_flush`)."""
        if self.parked.pop(key, None) is not None:
            self._parked_by[key[0]] -= 1
            if self._parked_by[key[0]] <= 0:
                del self._parked_by[key[0]]
        self._outbox.append((key[0], key[1], kind, value))

    def _flush(self) -> None:
        """Send the queued answers (not under the lock); none waits for a peer's room."""
        with self.lock:
            outbox, self._outbox = self._outbox, []
        for peer, req, kind, value in outbox:
            try:
                parts = self.serializer.dumps(value)
            except Exception as exc:
                kind, parts = ERROR, self.serializer.dumps(ValueError(f"cannot pickle the answer: {exc}"))
            self._deliver(peer, [(REPLY, [HEAD.pack(req, kind), *parts])])

    def _deliver(self, peer: Hashable, message: list[Any]) -> None:
        """Send a small answer now if ``peer``'s connection has room and nothing of its waits;
        else queue it for that peer's own sending thread (which alone may wait for it)."""
        size = sum(len(p) for p in message[0][1])
        self.slow.deliver(peer, message, size, inline=size <= INLINE_BYTES)

    def _peer_event(self, peer: Hashable, added: bool) -> None:
        if added:
            return
        with self.lock:
            who = self.names.pop(peer, f"a process connected as {peer!r}")
            self.origins.pop(peer, None)
            abrupt = peer not in self.leaving
            self.leaving.discard(peer)
            for key in [k for k in self.parked if k[0] == peer]:
                self.parked[key].done = True  # nobody to answer
                del self.parked[key]
            self._parked_by.pop(peer, None)
            for state in list(self.objects.values()):
                try:
                    state.peer_lost(peer, who, abrupt)
                except Exception:
                    log.exception("sync service: handling the loss of %s", who)
        self._flush()


def describe_here() -> dict[str, Any]:
    """What a client tells a service about its process (HELLO), to name it if it dies."""
    from fibercore.process import current_process
    from fibercore.util import machine_identity

    return {"name": current_process().name, "pid": os.getpid(), "host": socket.gethostname(),
            "machine": machine_identity()}


def _unset(kind: int, value: Any) -> None:  # pragma: no cover - replaced before any answer
    raise AssertionError("a local waiter was answered before it parked")


__all__ = ["SyncService", "Ref", "LOCAL"]
