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


def read_array_then_stop(big: Any) -> None:
    """Ask for a large shared Array four times at once, then stop (SIGSTOP, as a Slurm
    suspend or docker pause would) before reading the answers (64 MB each)."""
    import signal
    import threading

    for _ in range(4):
        threading.Thread(target=lambda: big[:], daemon=True).start()
    time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(3600)


def timed_acquire(lock: Any, counter: Any, timeout: float, out: Any) -> None:
    t0 = time.monotonic()
    ok = lock.acquire(timeout=timeout)
    took = time.monotonic() - t0
    counter.value += 1
    out.put((took, ok, counter.value))


def read_and_write_array(arr: Any, out: Any) -> None:
    out.put(list(arr))
    arr[3] = 99
