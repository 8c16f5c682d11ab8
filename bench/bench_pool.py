"""Pool benchmarks: fibercore vs multiprocessing (spawn), side by side in one run.

    python bench/bench_pool.py               # everything (a few minutes)
    python bench/bench_pool.py --quick       # smaller scale section
    python bench/bench_pool.py overhead rtt  # chosen sections only

Sections (issue "Pool", targets in brackets; ratio = fibercore / multiprocessing):
  overhead  the paper's framework overhead test: 5 workers, tasks sleeping d, 5/d tasks,
            ideal 1 s                                   [≤1.05 at 1 ms, ≤1.01 at ≥10 ms, time]
            and in rounds: 5 tasks, wait, 1/d times     [≤1.05]
  noop      map of 100,000 no-op items                   [≥1.0 tasks/s]
  rtt       one apply_async round trip                   [≤1.5 latency]
  bulk      20 tasks sending and returning 10 MB, bytes and numpy   [≥0.8 MB/s]
  startup   Pool(32) to the first result                 [≤1.2 time]
  mainfunc  functions of the script itself (``__main__``: fibercore sends them by value with
            their file name and source lines, multiprocessing's spawn child re-imports the
            script): 20 maps of 1,000 items, and a Process started and joined 20 times
  scale     one master with --workers local workers (default 256), and 1,024 lightweight
            worker clients on one pool: master task rate and memory (fibercore only)

A benchmark, not a test: nothing asserts. Task functions live in bench/_tasks.py so that
both libraries pickle them by reference.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _tasks
from _pool_clients import serve_as_workers

ROWS: list[tuple[str, str, float, float, str, str]] = []


def libs():
    import fibercore

    return [("fibercore", fibercore), ("multiprocessing", multiprocessing.get_context("spawn"))]


def record(name: str, unit: str, ours: float, theirs: float, better: str, target: str) -> None:
    ROWS.append((name, unit, ours, theirs, better, target))
    ratio = ours / theirs if theirs else float("nan")
    print(f"  {name:<34} fibercore {ours:>12.4g} {unit:<7} multiprocessing {theirs:>12.4g} {unit:<7}"
          f" ratio {ratio:6.3f} ({better} is better; target {target})", flush=True)


def both(measure, *args):
    out = {}
    for name, lib in libs():
        out[name] = measure(lib, *args)
    return out["fibercore"], out["multiprocessing"]


# ------------------------------------------------------------------------------------ sections
def overhead(lib, d: float) -> float:
    with lib.Pool(5) as pool:
        pool.map(_tasks.sleep_for, [0.3] * 5, 1)  # every worker up and warm
        n = int(round(5 / d))
        t0 = time.perf_counter()
        pool.map(_tasks.sleep_for, [d] * n)
        return time.perf_counter() - t0


def overhead_rounds(lib, d: float) -> float:
    """The same work in rounds: 5 tasks of d on 5 workers, wait for all, 1/d times (an ES
    generation at a time); every round pays the dispatch and result round trip."""
    with lib.Pool(5) as pool:
        pool.map(_tasks.sleep_for, [0.3] * 5, 1)
        rounds = int(round(1 / d))
        t0 = time.perf_counter()
        for _ in range(rounds):
            pool.map(_tasks.sleep_for, [d] * 5, 1)
        return time.perf_counter() - t0


def noop_rate(lib, n: int, processes: int = 2) -> float:
    with lib.Pool(processes) as pool:
        pool.map(_tasks.sleep_for, [0.3] * processes, 1)
        best = 0.0
        for _ in range(5):
            t0 = time.perf_counter()
            pool.map(_tasks.noop, range(n))
            best = max(best, n / (time.perf_counter() - t0))
        return best


def rtt(lib, n: int, processes: int = 2) -> float:
    with lib.Pool(processes) as pool:
        for i in range(50):
            pool.apply_async(abs, (i,)).get()
        samples = []
        for i in range(n):
            t0 = time.perf_counter()
            pool.apply_async(abs, (i,)).get()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1e6


def bulk(lib, kind: str) -> float:
    import numpy as np

    size = 10 << 20
    if kind == "bytes":
        items = [bytes([i]) * size for i in range(20)]
    else:
        items = [np.full(size // 8, i, dtype=np.float64) for i in range(20)]
    with lib.Pool(2) as pool:
        pool.map(_tasks.identity, items, 1)  # warm-up: first big allocations fault pages in
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            out = pool.map(_tasks.identity, items, 1)
            best = min(best, time.perf_counter() - t0)
            assert len(out) == 20
    return 2 * 20 * size / best / 1e6


def startup(lib, n: int) -> float:
    t0 = time.perf_counter()
    pool = lib.Pool(n)
    pool.apply(_tasks.noop, (1,))
    elapsed = time.perf_counter() - t0
    pool.terminate()
    pool.join()
    return elapsed


def main_square(x: int) -> int:
    """A function of the script itself (``__main__``), as most users' task functions are."""
    return x * x


def main_maps(lib, processes: int) -> float:
    """20 maps of 1,000 items of a ``__main__`` function (the function goes to the workers
    once per pool with fibercore, by name with multiprocessing)."""
    with lib.Pool(processes) as pool:
        pool.map(_tasks.sleep_for, [0.3] * processes, 1)
        t0 = time.perf_counter()
        for _ in range(20):
            pool.map(main_square, range(1000))
        return time.perf_counter() - t0


def main_processes(lib, processes: int) -> float:
    """``processes`` Processes with a ``__main__`` target, started and joined, 20 times over."""
    t0 = time.perf_counter()
    for _ in range(20 // processes or 1):
        ps = [lib.Process(target=main_square, args=(i,)) for i in range(processes)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
    return time.perf_counter() - t0


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def scale_local(workers: int) -> None:
    import fibercore

    rss0 = _rss_mib()
    t0 = time.perf_counter()
    pool = fibercore.Pool(workers)
    deadline = time.monotonic() + 600
    while pool._core.ready_count() < workers and time.monotonic() < deadline:
        time.sleep(0.1)
    ready = time.perf_counter() - t0
    n = 200_000
    t1 = time.perf_counter()
    pool.map(_tasks.noop, range(n), chunksize=10)
    rate = n / (time.perf_counter() - t1)
    t1 = time.perf_counter()
    pool.map(_tasks.sleep_for, [0.05] * (workers * 4), chunksize=1)
    ideal = 0.05 * 4
    print(f"  {workers} local workers: all ready after {ready:.1f} s; map of {n:,} no-op items (chunks of 10) "
          f"at {rate:,.0f} tasks/s; {workers * 4} tasks of 50 ms in {time.perf_counter() - t1:.2f} s "
          f"(ideal {ideal:.2f} s); master RSS {_rss_mib():.0f} MiB (+{_rss_mib() - rss0:.0f})", flush=True)
    pool.terminate()


def _reserve_external_slots(core, n: int) -> list[int]:
    """Reserve ``n`` worker slots of a pool for clients it did not start (this benchmark's
    harness; it reaches into the pool's fleet on purpose)."""
    with core.lock:
        return core.fleet.reserve(n)


def scale_clients(clients: int, per_job: int) -> None:
    import fibercore

    rss0 = _rss_mib()
    pool = fibercore.Pool(1)
    core = pool._core
    wids = _reserve_external_slots(core, clients)
    jobs = []
    for i in range(0, clients, per_job):
        p = fibercore.Process(target=serve_as_workers, args=(core.address, wids[i:i + per_job]), daemon=True)
        p.start()
        jobs.append(p)
    t0 = time.perf_counter()
    while core.ready_count() < clients + 1 and time.perf_counter() - t0 < 300:
        time.sleep(0.1)
    connected = core.ready_count() - 1
    n = 100_000
    t1 = time.perf_counter()
    out = pool.map(_tasks.noop, range(n), chunksize=1)
    elapsed = time.perf_counter() - t1
    assert out == list(range(n))
    print(f"  {connected} worker clients on one pool ({len(jobs)} jobs x {per_job} sockets): "
          f"{n:,} one-item tasks in {elapsed:.2f} s = {n / elapsed:,.0f} tasks/s through the master; "
          f"master RSS {_rss_mib():.0f} MiB (+{_rss_mib() - rss0:.0f} for the pool)", flush=True)
    pool.terminate()
    for p in jobs:
        p.kill()
        p.join(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="*",
                        default=["overhead", "noop", "rtt", "bulk", "startup", "mainfunc", "scale"])
    parser.add_argument("--quick", action="store_true", help="smaller scale section (64 workers, 256 clients)")
    parser.add_argument("--workers", type=int, default=256, help="local workers in the scale section")
    parser.add_argument("--processes", default="2", metavar="N[,M]",
                        help="workers of the noop, rtt and mainfunc sections; several: one row each "
                             "(e.g. 2,8 on 2 cores: processes <= cores and 4x more)")
    parser.add_argument("--report", metavar="STEM", help="also write STEM.md (the table) and STEM.png (a plot of "
                                                         "the ratios), e.g. docs/perf/bench_pool")
    args = parser.parse_args()
    counts = [int(n) for n in args.processes.split(",")]
    print(f"bench_pool on {os.cpu_count()} CPUs, Python {sys.version.split()[0]}", flush=True)
    if "overhead" in args.sections:
        print("framework overhead (5 workers, 5/d tasks of d; ideal 1 s):")
        for d in (1.0, 0.1, 0.01, 0.001):
            ours, theirs = both(overhead, d)
            record(f"overhead d={d * 1000:g} ms", "s", ours, theirs, "lower", "≤1.05 at 1 ms, ≤1.01 above")
        print("the same in rounds (5 tasks of d, wait, 1/d times; ideal 1 s):")
        for d in (0.01, 0.001):
            ours, theirs = both(overhead_rounds, d)
            record(f"rounds d={d * 1000:g} ms", "s", ours, theirs, "lower", "≤1.05")
    if "noop" in args.sections:
        for n in counts:
            ours, theirs = both(noop_rate, 100_000, n)
            record(f"no-op map of 100,000, {n} workers", "tasks/s", ours, theirs, "higher", "≥1.0")
    if "rtt" in args.sections:
        for n in counts:
            ours, theirs = both(rtt, 1000, n)
            record(f"apply_async round trip, {n} workers", "µs", ours, theirs, "lower", "≤1.5")
    if "mainfunc" in args.sections:
        for n in counts:
            ours, theirs = both(main_maps, n)
            record(f"20 maps of a __main__ function, {n} workers", "s", ours, theirs, "lower", "≤1.1")
            ours, theirs = both(main_processes, n)
            record(f"{n} Processes of a __main__ target x{20 // n or 1}", "s", ours, theirs, "lower", "—")
    if "bulk" in args.sections:
        for kind in ("bytes", "numpy"):
            ours, theirs = both(bulk, kind)
            record(f"20 x 10 MB there and back, {kind}", "MB/s", ours, theirs, "higher", "≥0.8")
    if "startup" in args.sections:
        ours, theirs = both(startup, 32)
        record("Pool(32) to first result", "s", ours, theirs, "lower", "≤1.2")
    if "scale" in args.sections:
        print("scale (fibercore only):")
        scale_local(64 if args.quick else args.workers)
        scale_clients(256 if args.quick else 1024, 128)
    if ROWS:
        print("\n" + table())
        if args.report:
            write_report(args.report)


def speed(ours: float, theirs: float, better: str) -> float:
    """fibercore's speed relative to multiprocessing, above 1 when fibercore is faster: the
    ratio for a rate, its inverse for a time (what the plot shows, and the table beside it)."""
    return theirs / ours if better == "lower" else ours / theirs


def table() -> str:
    lines = ["| measurement | fibercore | multiprocessing | ratio | fibercore's speed (>1: faster) | target |",
             "|---|---|---|---|---|---|"]
    for name, unit, ours, theirs, better, target in ROWS:
        lines.append(f"| {name} | {ours:.4g} {unit} | {theirs:.4g} {unit} | {ours / theirs:.3f} | "
                     f"{speed(ours, theirs, better):.2f}x | {target} |")
    return "\n".join(lines)


def write_report(stem: str) -> None:
    """STEM.md: the table with the machine and date; STEM.png: each row as fibercore's speed
    relative to multiprocessing (above 1: fibercore is faster), from this run."""
    import datetime

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    os.makedirs(os.path.dirname(stem) or ".", exist_ok=True)
    when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with open(stem + ".md", "w") as fh:
        fh.write(f"`python bench/bench_pool.py --quick` on {os.cpu_count()} CPUs, Python "
                 f"{sys.version.split()[0]}, {when}; ratio = fibercore / multiprocessing (spawn).\n\n{table()}\n")
    from matplotlib.patches import Patch

    names = [r[0] for r in ROWS]
    speeds = [speed(ours, theirs, better) for _n, _u, ours, theirs, better, _t in ROWS]
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(ROWS) + 1.6))
    bars = ax.barh(names[::-1], speeds[::-1], color=["tab:green" if v >= 1 else "tab:orange" for v in speeds[::-1]])
    ax.bar_label(bars, labels=[f"{v:.2f}x" for v in speeds[::-1]], fontsize=7, padding=2)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(0, max(speeds + [1.0]) * 1.18)
    ax.set_xlabel("fibercore's speed vs multiprocessing (spawn), >1: faster")
    fig.legend(handles=[Patch(color="tab:green", label="fibercore faster (>1)"),
                        Patch(color="tab:orange", label="fibercore slower (<1)")],
               fontsize=8, loc="lower center", ncol=2, frameon=False)
    ax.set_title(f"bench_pool, one run ({os.cpu_count()} CPUs, {when})", fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(stem + ".png", dpi=100)
    print(f"wrote {stem}.md and {stem}.png")


if __name__ == "__main__":
    main()
