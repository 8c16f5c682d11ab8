"""The narrow state every room of one Pool reads: its name, lock, life, health and settings.

The rooms form a DAG (``shared`` <- ``dispatch`` <- ``fleet`` <- ``supervision`` <-
``scheduler``): a room reads this object and calls the methods of the rooms below it,
never their dicts; a room below tells one above through a callback it was given (the
fleet's ``on_launch_failed``), not by holding it.

Lock rule: ``state``, ``finished``, ``broken``, ``task_error``, ``stats`` and ``last_error``
change under ``lock`` (an RLock, with the condition ``changed``), the one lock of the pool's rooms.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fibercore.pool.records import RUN
from fibercore.serialization import Serializer
from fibercore.wire import Channel


@dataclass(frozen=True)
class PoolSettings:
    """What a Pool was created with and its workers are started with."""

    initializer: Callable[..., Any] | None
    initargs: tuple[Any, ...]
    maxtasks: int | None
    resources: dict[str, Any]
    #: Times a chunk of a dead worker runs again on a fresh one (``max_task_retries``).
    retries: int
    #: Times a chunk whose function raised runs again before the error is its result.
    error_retries: int
    #: Seconds a worker job may take to join the pool, and how many start at once (0: all).
    start_timeout: float
    start_concurrency: int


@dataclass
class PoolShared:
    """One pool's name, endpoint, lock, life state, health and counters."""

    name: str
    channel: Channel
    serializer: Serializer
    settings: PoolSettings
    #: The session and backend, for messages that name where a job ran.
    session: str
    backend: str
    lock: threading.RLock = field(default_factory=threading.RLock)
    state: str = RUN
    #: Set once join() let the workers go (or terminate()): nothing is started again.
    finished: bool = False
    #: Why nothing can run (the initializer raises, jobs never start); None while healthy.
    broken: BaseException | None = None
    #: The error tasks of a broken pool fail with (``broken``, or the user's own exception).
    task_error: BaseException | None = None
    stats: dict[str, int] = field(default_factory=lambda: {
        "retried_chunks": 0, "replaced_workers": 0, "stolen_chunks": 0, "rerun_after_error": 0,
        "done_tasks": 0, "failed_tasks": 0, "cancelled_tasks": 0,
        # workers declared lost by the heartbeat; results that came after a chunk's first
        "lost_silent": 0, "duplicate_results": 0})
    #: The last task that failed: (epoch seconds, "map(f): ValueError: ..."), for fiber top.
    last_error: tuple[float, str] | None = None

    def __post_init__(self) -> None:
        self.changed = threading.Condition(self.lock)

    @property
    def address(self) -> str:
        return self.channel.address


__all__ = ["PoolSettings", "PoolShared"]
