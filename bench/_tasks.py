"""Task functions for bench_pool.py, importable by reference in both libraries' workers."""

from __future__ import annotations

import time
from typing import Any


def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


def noop(x: Any) -> Any:
    return x


def identity(x: Any) -> Any:
    return x
