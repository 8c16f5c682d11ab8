"""Handles: what ``Lock()``, ``Event()``... return, in the creating process and in any job.

A handle names its object by the address of its creator's service and an id. It
pickles to that name (passed to a job as an argument, in a Pool's initargs, through a
queue), and in another process it talks to the service over one connection per
process (:func:`client`); in the creating process it calls the service directly.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from typing import Any, ClassVar

from fibercore import rpc
from fibercore.errors import AbandonedLockWarning
from fibercore.lifetime import PerProcess, at_process_end, current_pid
from fibercore.observe import registry
from fibercore.rpc import RETURN
from fibercore.runtime import adopt_credentials, credentials_for_child, get_runtime
from fibercore.sync.service import BYE, CALL, CANCEL, HELLO, SyncService, describe_here
from fibercore.sync.states import State

#: Seconds a call whose timeout passed (or a non-blocking try) waits for the service's
#: answer before it gives up on a service that does not answer.
ANSWER_GRACE = 0.5
_WAIT = object()  # _call's gave_up: nothing to give up with, wait for the answer


#: This process's services, one per address jobs reach it at (made on first use): after
#: ``init()`` moves jobs to another network (a cluster's), new objects are served where
#: those jobs can dial, and objects made before stay where their users reach them.
_services: dict[tuple[Any, ...], SyncService] = {}
_service_lock = threading.Lock()
_greeted: PerProcess[str, rpc.Client] = PerProcess()  # clients that sent HELLO, by address


def _where() -> tuple[Any, ...]:
    rt = get_runtime()
    return (current_pid(), *rt.listener_kind)


def service() -> SyncService:
    """This process's synchronization service for the current configuration's address
    (started on first use)."""
    key = _where()
    svc = _services.get(key)
    if svc is not None:
        return svc
    with _service_lock:
        svc = _services.get(key)
        if svc is None:
            for other in [k for k in _services if k[0] != key[0]]:  # a forked child's copies
                del _services[other]
            svc = _services[key] = SyncService()
        return svc


def _mine() -> list[SyncService]:
    pid = current_pid()
    return [svc for svc in list(_services.values()) if svc.pid == pid]


def _local(address: str) -> SyncService | None:
    """The service at ``address`` when it is this process's own."""
    return next((svc for svc in _mine() if svc.address == address), None)


def client(address: str) -> rpc.Client:
    """This process's connection to the service at ``address`` (it introduces itself once)."""
    found = _greeted.peek(address)
    if found is not None and not found.closed:
        return found

    def make() -> rpc.Client:
        made = rpc.client(address, None, f"the synchronization service at {address}", "sync")
        made.request(HELLO, 0, describe_here(), reply=False)
        at_process_end(_say_bye)
        return made

    found = _greeted.get(address, make)
    if found.closed:  # the service went away before: fail clearly through a fresh attempt
        _greeted.discard(found)
        found = _greeted.get(address, make)
    return found


def _say_bye() -> None:
    """At the end of this process: tell every service it leaves on purpose (not dying)."""
    for made in _greeted.here():
        if not made.closed:
            try:
                made.request(BYE, 0, None, reply=False)
            except Exception:
                pass


class Handle:
    """Base of the shared objects' handles: where the object lives, and calling it."""

    _state_kind: ClassVar[str] = "object"
    _address: str
    _oid: int
    _creator: int

    def _create(self, state: State) -> None:
        # An object tied to another one (a Value's lock, a Condition's) lives in that one's
        # service, which may be an earlier address of this process (before an init()).
        home = getattr(self, "_home", None)
        svc = (_local(home) if home else None) or service()
        self._address, self._oid, self._creator = svc.address, svc.add(state), os.getpid()
        weakref.finalize(self, svc.release, self._oid).atexit = False

    def _call(self, method: str, *args: Any, timeout: float | None = None, wait: bool = False,
              gave_up: Any = _WAIT, undo: str | None = None) -> Any:
        """Run ``method`` on the object; ``wait``: it may block, up to ``timeout`` (None: forever).

        With ``gave_up`` (an acquire, an Event's wait), a call with a timeout, or a
        non-blocking try, returns within :data:`ANSWER_GRACE` of it even when the service
        does not answer (stalled, its machine gone): ``gave_up`` is returned, and a late
        answer that granted something is undone (``undo``, sent without waiting: an
        acquire's late grant is released). Without it (a Condition's or Barrier's wait,
        whose answer must come: the lock taken back, the barrier passed) the final answer
        is awaited.
        """
        svc = _local(self._address)
        if svc is not None:
            return svc.call_local(self._oid, method, args, timeout)
        conn = client(self._address)
        future = conn.request(CALL, self._oid, (method, args))
        if wait and timeout is not None and not future.wait(max(0.0, timeout)):
            conn.request(CANCEL, self._oid, future.req, reply=False)
            if gave_up is not _WAIT and not future.wait(ANSWER_GRACE):
                return self._abandon(conn, future, gave_up, undo)
        elif not wait and gave_up is not _WAIT and not future.wait(ANSWER_GRACE):  # a non-blocking try
            return self._abandon(conn, future, gave_up, undo)
        return future.get()

    def _abandon(self, conn: Any, future: Any, gave_up: Any, undo: str | None) -> Any:
        def late(kind: int, value: Any) -> None:
            if undo is not None and kind == RETURN and value:
                self._send(undo)

        if not conn.abandon(future, late):
            return future.get()  # the answer is arriving after all
        return gave_up

    def _send(self, method: str, *args: Any) -> None:
        """Run ``method`` without waiting for its answer (another process: one frame out;
        later requests of this process are served after it, in order)."""
        svc = _local(self._address)
        if svc is not None:
            svc.call_local(self._oid, method, args, None)
        else:
            client(self._address).request(CALL, self._oid, (method, args), reply=False)

    def _remote(self) -> bool:
        return _local(self._address) is None

    # -- identity and pickling -------------------------------------------------------------------
    def _extra(self) -> tuple[Any, ...]:
        """Handle fields beyond the name (a Barrier's parties and action...)."""
        return ()

    def _restore(self, extra: tuple[Any, ...]) -> None:
        pass

    def __reduce__(self) -> Any:
        svc = _local(self._address)
        if svc is not None:
            svc.pin(self._oid)  # another process may use it: keep it for the service's life
        return (_rebuild, (type(self), self._address, self._oid, self._creator, self._extra(),
                           credentials_for_child()))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Handle) and (self._address, self._oid) == (other._address, other._oid)

    def __hash__(self) -> int:
        return hash((self._address, self._oid))


def _rebuild(cls: type[Handle], address: str, oid: int, creator: int, extra: tuple[Any, ...],
             credentials: tuple[str, bytes] | None = None) -> Handle:
    adopt_credentials(credentials)
    handle = cls.__new__(cls)
    handle._address, handle._oid, handle._creator = address, oid, creator
    handle._restore(extra)
    return handle


def granted(answer: Any) -> bool:
    """An acquire's answer: True/False, or the story of an abandoned lock (warned, then True)."""
    if isinstance(answer, str):
        warnings.warn(answer, AbandonedLockWarning, stacklevel=3)
        return True
    return bool(answer)


def owner_name(owner: Any, creator: int) -> str:
    """A lock owner (peer, thread) named as multiprocessing's repr names it: the process's
    name, and ``|thread`` when it is not the main thread; another process's is not known here."""
    if owner is None:
        return "None"
    peer, thread = owner
    if peer != "local" or os.getpid() != creator:
        return "SomeOtherProcess"
    from fibercore.process import current_process

    found = threading._active.get(thread)  # type: ignore[attr-defined]
    name = current_process().name
    if found is None or found is threading.main_thread():
        return name
    return f"{name}|{found.name}"


def _views() -> list[dict[str, Any]]:
    """What ``fiber top`` and the dashboard show of the shared objects this process serves."""
    return [view for svc in _mine() for view in svc.view()]


registry.provide("sync", _views)
