"""What the views (``fiber top``, the dashboard) can list of this program, and nothing else finds.

Pools and managers are held here weakly (a program's forgotten pool is collected as
before); adding one is a set insertion when the object is made. The modules that keep
the other objects (started processes, queue brokers, the sync service) each give one
function that lists them (:func:`provide`, at import): the snapshot reads through these,
never the privates of those modules. Nothing here imports them, nor the dashboard.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_managers: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_sources: dict[str, Callable[[], list[Any]]] = {}

#: The kinds a module may :func:`provide`, and what each lists.
KINDS = {
    "jobs": "this process's started Processes, as :class:`Started`",
    "queues": "the views of this process's live queue brokers (dicts)",
    "sync": "the views of the shared objects this process's sync service holds (dicts)",
}


class Started(NamedTuple):
    """A Process this master started: its name, its backend's job (None while starting) and
    its exit code (None while it runs)."""

    name: str
    job: Any
    returncode: int | None


def track_pool(pool: Any) -> None:
    with _lock:
        _pools.add(pool)


def track_manager(manager: Any) -> None:
    with _lock:
        _managers.add(manager)


def pools() -> list[Any]:
    with _lock:
        return list(_pools)


def managers() -> list[Any]:
    with _lock:
        return list(_managers)


def provide(kind: str, lister: Callable[[], list[Any]]) -> None:
    """The module that keeps objects of ``kind`` (a key of :data:`KINDS`) says how to list them."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    _sources[kind] = lister


def listed(kind: str) -> list[Any]:
    """The objects of ``kind`` now (empty when the module that keeps them was never imported)."""
    lister = _sources.get(kind)
    return list(lister()) if lister is not None else []


def started() -> list[Started]:
    """This process's started jobs (a copy; no backend is asked anything)."""
    return listed("jobs")


__all__ = ["KINDS", "Started", "listed", "managers", "pools", "provide", "started", "track_manager",
           "track_pool"]
