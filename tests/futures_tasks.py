"""Task functions the futures tests send to workers (importable by the jobs)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path


def sleep_then(value: object, seconds: float) -> object:
    time.sleep(seconds)
    return value


def mark_then_sleep(path: str, seconds: float) -> int:
    """Leave a file saying this ran (in this worker), then sleep.

    Written beside and renamed into place, so a reader never sees it empty."""
    partial = Path(f"{path}.{os.getpid()}.partial")
    partial.write_text(str(os.getpid()))
    partial.replace(path)
    time.sleep(seconds)
    return os.getpid()


def pid(_: object = None) -> int:
    return os.getpid()


def die_once(path: str, value: int) -> int:
    """SIGKILL this worker the first time (the marker file is made), return ``value`` after."""
    marker = Path(path)
    if not marker.exists():
        marker.write_text("died")
        os.kill(os.getpid(), signal.SIGKILL)
    return value


def fail(message: str) -> None:
    raise ValueError(message)


def square(x: float) -> float:
    return x * x


def sphere(x: list[float]) -> float:
    return float(sum(v * v for v in x))
