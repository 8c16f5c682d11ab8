"""Jobs this process declared lost, told to every part of it that talks to them.

The admin hub declares a job on another machine lost when it is silent past
``heartbeat_timeout`` (:mod:`fibercore.admin`). TCP alone would notice much later when it
has sent data the peer never acknowledged (retransmissions go on for many minutes), so
the hub tells this module, and each part of the process that keeps connections from or to
jobs drops those of the lost one at once: the synchronization service (a
ParameterServer round stops waiting for it, its locks are released), a manager's clients
(a proxy call raises instead of waiting). A job is named by its worker's host name and
pid, as it introduced itself, and its machine identity (:func:`fibercore.util.machine_identity`:
boot id and network namespace) where both sides know it: two containers may share a host
name and a pid.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger("fibercore.liveness")

Listener = Callable[[str, int, str], None]

_listeners: list[Callable[[], Listener | None]] = []
_lock = threading.Lock()


def on_lost(listener: Listener) -> None:
    """Call ``listener(host, pid, machine)`` for each job declared lost from now on. A bound method
    is held weakly (its object may go), anything else strongly."""
    ref: Callable[[], Listener | None]
    if hasattr(listener, "__self__") and hasattr(listener, "__func__"):
        ref = weakref.WeakMethod(listener)
    else:
        ref = lambda: listener  # noqa: E731
    with _lock:
        _listeners.append(ref)


def same_job(where: tuple[str, int, str], host: str, pid: int, machine: str) -> bool:
    """Whether ``where`` (host, pid, machine identity; "" when unknown) names the job lost."""
    return where[0] == host and where[1] == pid and (not where[2] or not machine or where[2] == machine)


def declare_lost(host: str, pid: int, machine: str = "") -> None:
    """Job ``pid`` on ``host`` (machine identity ``machine``, "" if unknown) is lost: every
    listener drops what ties it to that job."""
    with _lock:
        live = [(ref, ref()) for ref in _listeners]
        _listeners[:] = [ref for ref, fn in live if fn is not None]
    for _ref, fn in live:
        if fn is None:
            continue
        try:
            fn(host, pid, machine)
        except Exception:
            log.exception("dropping the connections of lost job %s on %s", pid, host)


__all__ = ["declare_lost", "on_lost", "same_job"]
