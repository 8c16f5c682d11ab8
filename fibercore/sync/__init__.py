"""Synchronization primitives and shared values across jobs (``multiprocessing.synchronize``
and ``multiprocessing.sharedctypes``), served by the process that creates them.

Layout: :mod:`~fibercore.sync.states` (the rules of each object, as state machines),
:mod:`~fibercore.sync.service` (the per-process service that runs them and answers
requests), :mod:`~fibercore.sync.handles` (what a handle is, how it calls and pickles),
:mod:`~fibercore.sync.primitives` (Lock ... Barrier) and :mod:`~fibercore.sync.shared`
(Value, Array and their raw forms). See docs/sync.md.
"""

from fibercore.errors import AbandonedLockWarning, BrokenBarrierError
from fibercore.sync.primitives import (
    Barrier,
    BoundedSemaphore,
    Condition,
    Event,
    Lock,
    RLock,
    Semaphore,
)
from fibercore.sync.shared import Array, RawArray, RawValue, Value

__all__ = [
    "AbandonedLockWarning",
    "Array",
    "Barrier",
    "BoundedSemaphore",
    "BrokenBarrierError",
    "Condition",
    "Event",
    "Lock",
    "RLock",
    "RawArray",
    "RawValue",
    "Semaphore",
    "Value",
]
