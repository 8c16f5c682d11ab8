"""Manager benchmarks: proxy method round trip vs multiprocessing managers (same run),
and AsyncManager throughput with 16 shared objects.

    python bench/bench_managers.py

A benchmark, not a test: nothing asserts. Ratios are fibercore / multiprocessing.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time


class Box:
    """A shared object whose method does almost nothing."""

    def __init__(self) -> None:
        self.n = 0

    def bump(self) -> int:
        self.n += 1
        return self.n


def proxy_rtt(manager_cls, n: int = 2000) -> float:
    with manager_cls() as m:
        d = m.dict()
        for i in range(100):
            d["k"] = i
        samples = []
        for i in range(n):
            t0 = time.perf_counter()
            d["k"] = i
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e6


def async_throughput(n_objects: int = 16, calls: int = 200) -> float:
    from fibercore.managers import AsyncManager

    class BoxManager(AsyncManager):
        pass

    BoxManager.register("Box", Box)
    with BoxManager() as m:
        boxes = [m.Box() for _ in range(n_objects)]
        for b in boxes:
            b.bump().get()
        t0 = time.perf_counter()
        handles = [b.bump() for _ in range(calls) for b in boxes]
        for h in handles:
            h.get(60)
        return len(handles) / (time.perf_counter() - t0)


def main() -> None:
    import fibercore.managers

    ours = proxy_rtt(fibercore.managers.SyncManager)
    theirs = proxy_rtt(multiprocessing.get_context("spawn").Manager().__class__)
    print(f"proxy method round trip (median): fibercore {ours:.0f} µs, multiprocessing {theirs:.0f} µs, "
          f"ratio {ours / theirs:.2f} (lower is better)")
    rate = async_throughput()
    print(f"AsyncManager, 16 objects, 3,200 calls in flight: {rate:,.0f} calls/s")


if __name__ == "__main__":
    main()
