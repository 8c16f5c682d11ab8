"""Synchronization benchmarks: a job using a Lock and a Value created by the master, side by
side with multiprocessing in the same run.

    python bench/bench_sync.py

For each operation, the median over many calls made from a child process:
- fibercore (``fibercore.Lock()``, ``fibercore.Value()``: the master's sync service; the
  child maps the value's shared memory, as a local job does; the ", served" rows are the
  same operations through the service, as a job on another machine makes them);
- multiprocessing's manager proxies (``Manager().Lock()``, ``Manager().Value()``): the fair
  comparison across processes (a server, every access a round trip);
- multiprocessing's shared-memory objects (``multiprocessing.Lock()``, ``Value()``): the floor
  on one machine, which no cross-machine design reaches.
Ratios are fibercore / multiprocessing (lower is better); the issue's target is <= 2x the
manager proxies. A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable
from typing import Any

N = 2000


def _median_us(op: Callable[[], Any], n: int = N) -> float:
    for _ in range(100):
        op()
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        op()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def measure(lock: Any, value: Any, event: Any, out: Any) -> None:
    """In the child: median µs of an uncontended acquire+release, a Value read, a Value
    write, an increment under the Value's lock, an Event.is_set()."""

    def acquire_release() -> None:
        lock.acquire()
        lock.release()

    def read() -> None:
        value.value  # noqa: B018

    def write() -> None:
        value.value = 7

    def increment() -> None:
        with value.get_lock():
            value.value += 1

    result = {
        "acquire+release": _median_us(acquire_release),
        "Value read": _median_us(read),
        "Value write": _median_us(write),
        "increment under get_lock()": _median_us(increment) if hasattr(value, "get_lock") else None,
        "Event.is_set()": _median_us(event.is_set),
    }
    if getattr(value, "_local", None) is not None:
        # This job maps the value's shared memory (same machine). A job on another machine
        # cannot: every access goes to the creator's service. Measure that path too.
        value._local = None
        result["Value read, served"] = _median_us(read)
        result["Value write, served"] = _median_us(write)
        result["increment under get_lock(), served"] = _median_us(increment)
    out.put(result)


def run(ctx: Any, lock: Any, value: Any, event: Any) -> dict[str, float]:
    out = ctx.Queue()
    p = ctx.Process(target=measure, args=(lock, value, event, out))
    p.start()
    result = out.get(timeout=300)
    p.join(60)
    return result


def main() -> None:
    import fibercore

    ours = run(fibercore, fibercore.Lock(), fibercore.Value("i", 0), fibercore.Event())
    spawn = multiprocessing.get_context("spawn")
    with spawn.Manager() as manager:
        managed = run(spawn, manager.Lock(), manager.Value("i", 0), manager.Event())
    shared = run(spawn, spawn.Lock(), spawn.Value("i", 0), spawn.Event())
    print(f"{'median µs, from a child':38} {'fibercore':>10} {'mp manager':>11} {'ratio':>6} "
          f"{'mp shm':>8} {'ratio':>7}")
    for key, value in ours.items():
        base = key.replace(", served", "")
        m, s = managed.get(base), shared.get(base)
        mtext = f"{m:11.1f} {value / m:6.2f}" if m else f"{'n/a':>11} {'':>6}"
        stext = f"{s:8.2f} {value / s:7.0f}" if s else ""
        print(f"{key:38} {value:10.1f} {mtext} {stext}")


if __name__ == "__main__":
    main()
