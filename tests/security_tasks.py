"""Job bodies for tests/test_security.py (importable by the jobs)."""

from __future__ import annotations

import os
import time
from typing import Any

ITEMS = 2000


def square(x: int) -> int:
    return x * x


def own_pid(_: Any) -> int:
    time.sleep(0.05)
    return os.getpid()


def report_pid(q: Any) -> None:
    q.put(os.getpid())
    time.sleep(1.0)


def echo(conn: Any) -> None:
    while True:
        msg = conn.recv()
        if msg is None:
            return
        conn.send(("pong", msg[1]))


def produce(q: Any, stop_file: str) -> None:
    """Puts ITEMS numbers, spread over the attack."""
    for i in range(ITEMS):
        q.put(i)
        if i % 100 == 0:
            time.sleep(0.05)


def consume(q: Any, out: Any) -> None:
    for _ in range(ITEMS):
        out.put(q.get(timeout=120))
