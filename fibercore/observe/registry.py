"""The objects of this program that the views list and nothing else finds: pools and managers.

Held weakly (a program's forgotten pool is collected as before); adding one is a set
insertion when the object is made. Queues, shared objects and processes are found where
fibercore already keeps them (the brokers table, the sync service, the children set).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_pools: weakref.WeakSet[Any] = weakref.WeakSet()
_managers: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()


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


__all__ = ["managers", "pools", "track_manager", "track_pool"]
