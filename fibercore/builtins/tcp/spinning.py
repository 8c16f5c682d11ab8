"""When a waiting read may poll before it sleeps: only with a CPU to spare, and while polls
pay off (config ``spin_wait``; off by default)."""

from __future__ import annotations

import os
import time
from typing import Any

#: Seconds a waiting read polls the socket before it sleeps in the kernel (config ``spin_wait``,
#: in microseconds), when a CPU is free for it (:func:`cpu_to_spare`). Off by default: in the
#: usual RL set-up (more simulators than cores) the gate let a master poll while the processes
#: it waited for needed the CPUs, and polling cost 15-18% of the steps (docs/performance.md).
DEFAULT_SPIN = 0.0
#: Seconds between two looks at how many tasks this machine runs (:func:`cpu_to_spare`).
LOAD_LOOK_EVERY = 0.005


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


_CPUS = _usable_cpus()
_load_look: list[Any] = [0.0, False]  # when this process last looked, and what it saw


class SpinGate:
    """Whether one reader's next wait may poll: only with a CPU to spare (:func:`cpu_to_spare`)
    and while polls pay off. A poll that ran out before the data came skips the next 1, 2,
    4 ... 64 chances to poll (a reader that waits long, as a simulator waits for its next
    action behind seven others, stops polling); one that caught its data opens the gate again."""

    __slots__ = ("_skip", "_backoff")

    def __init__(self) -> None:
        self._skip = 0
        self._backoff = 0

    def open(self) -> bool:
        if self._skip:
            self._skip -= 1
            return False
        return cpu_to_spare()

    def result(self, caught: bool) -> None:
        if caught:
            self._backoff = 0
        else:
            self._backoff = min(64, 2 * self._backoff or 1)
            self._skip = self._backoff


def cpu_to_spare() -> bool:
    """Whether a waiting read may poll for a while: no more tasks runnable on this machine
    than it has CPUs, so polling takes a CPU nobody else wants.

    When processes outnumber cores (several simulators per core, the usual RL set-up),
    the process being waited for needs the CPU a poller would hold: there a poll halved a
    stepped simulator's throughput, while on an idle CPU it saves the wake-up of a sleeping
    reader (a 1:1 round trip in about half the time). Read from ``/proc/loadavg``'s
    running count at most every :data:`LOAD_LOOK_EVERY` seconds; without it, never poll.
    """
    now = time.perf_counter()
    look = _load_look
    if now - look[0] < LOAD_LOOK_EVERY:
        return look[1]
    try:
        with open("/proc/loadavg", "rb") as fh:
            running = int(fh.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        running = _CPUS + 1
    look[0], look[1] = now, running <= _CPUS
    return look[1]
