"""Module-level pool task functions (workers and multiprocessing import them by reference)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

_initialized: Any = None


class TaskError(Exception):
    """Raised by tasks on purpose; pickles like any plain exception."""


def square(x: int) -> int:
    return x * x


def square_or_raise(x: int, bad: frozenset[int] = frozenset()) -> int:
    if x in bad:
        raise TaskError(f"bad item {x}")
    return x * x


class SquareOrRaise:
    """A picklable callable: ``square_or_raise`` with a fixed set of bad items."""

    def __init__(self, bad: frozenset[int]) -> None:
        self.bad = bad

    def __call__(self, x: int) -> int:
        return square_or_raise(x, self.bad)


def add(a: int, b: int = 0) -> int:
    return a + b


def slow_square(x: int, seconds: float = 0.001) -> int:
    time.sleep(seconds)
    return x * x




def pid(_: Any = None) -> int:
    return os.getpid()


def init_global(value: Any) -> None:
    global _initialized
    _initialized = (value, os.getpid())


def read_global(_: Any = None) -> Any:
    """What the initializer stored, and the pid running this task."""
    return _initialized, os.getpid()


def init_raises(message: str) -> None:
    raise TaskError(message)


def die_hard(_: Any = None) -> None:
    """Print something, then die as an OOM kill would (SIGKILL to itself)."""
    print("about to be killed: out of memory (simulated)", flush=True)
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def die_once(marker: str) -> str:
    """Kill the worker the first time (marker file absent), succeed on the retry."""
    if not os.path.exists(marker):
        with open(marker, "w") as fh:
            fh.write(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)
    return "survived"


def lock_result(_: Any = None) -> Any:
    import threading

    return threading.Lock()


def exit_at(x: int, at: int = 25, code: int = 3) -> int:
    """End the worker process with ``code`` (as os._exit in a library would) at item ``at``."""
    if x == at:
        os._exit(code)
    return x


def identity(x: Any) -> Any:
    return x


def random_error_worker(i: int) -> int:
    """The original fiber's test task: raises ValueError 5% of the time."""
    import random

    time.sleep(0.01)
    if random.random() < 0.05:
        raise ValueError
    return i


def raise_value_error(message: str) -> None:
    raise ValueError(message)


def wait_for(event: Any, timeout: float = 120) -> bool:
    """A long task: runs until the test sets ``event`` (what it waits for is the test's
    state, not a time)."""
    return bool(event.wait(timeout))


def resident_mb(data: Any = None) -> float:
    """This worker's resident memory now, in MB (while ``data``, its argument, is alive)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")
