"""Job targets of tests/test_sync.py (module level: jobs import them by reference)."""

from __future__ import annotations

import os
import time
from typing import Any


def count_under_lock(lock: Any, counter: Any, n: int) -> None:
    for _ in range(n):
        with lock:
            counter.value += 1


def count_with_get_lock(counter: Any, n: int) -> None:
    for _ in range(n):
        with counter.get_lock():
            counter.value += 1


def hold_lock_forever(lock: Any, holding: Any) -> None:
    lock.acquire()
    holding.set()
    time.sleep(600)


def wait_at_barrier(barrier: Any, out: Any) -> None:
    try:
        barrier.wait()
        out.put("passed")
    except Exception as exc:
        out.put(f"{type(exc).__name__}: {exc}")


def join_barrier_then_sleep(barrier: Any, ready: Any) -> None:
    ready.set()  # the barrier arrived as an argument: this job is one of its parties
    time.sleep(600)


def join_barrier_and_return(barrier: Any) -> None:
    """A party that leaves on purpose: its process ends normally (and says goodbye)."""
    assert barrier.parties >= 1


def barrier_rounds(j: int, barrier: Any, progress: Any, lock: Any, rounds: int) -> None:
    """Every round, every party sees every other party at least at the previous round."""
    for i in range(rounds):
        barrier.wait()
        with lock:
            assert min(progress[:]) >= i - 1, (j, i, progress[:])
            progress[j] = i


def run_script(ops: list[tuple[str, int]], who: int, lock: Any, cond: Any, seq: Any, log: Any,
               tokens: Any) -> None:
    """Run a list of operations; every event is logged with a sequence number taken under
    the lock, so the log's order is the order of the critical sections.

    - ("cs", k): enter the critical section, hold it for k ms, leave.
    - ("produce", k): add k tokens under the condition and notify k waiters.
    - ("consume", 1): wait (condition) until a token is there, take it.
    """
    def note(event: str) -> None:
        seq.value += 1
        log.put((seq.value, who, event, os.getpid()))

    for op, k in ops:
        if op == "cs":
            with lock:
                note("enter")
                time.sleep(k / 1000)
                note("exit")
        elif op == "produce":
            with cond:
                tokens.value += k
                note(f"produce {k}")
                cond.notify(k)
        elif op == "consume":
            with cond:
                if not cond.wait_for(lambda: tokens.value > 0, timeout=30):
                    note("starved")
                    continue
                tokens.value -= 1
                note("consume")
