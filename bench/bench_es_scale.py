"""The paper's ES experiment at its scale: one master, N workers, population 2,048.

    python bench/bench_es_scale.py                          # N = 32 ... 1,024, fibercore + mp fork/spawn
    python bench/bench_es_scale.py --workers 32,256 --generations 3
    python bench/bench_es_scale.py --simulate 32,1024,4096  # the master alone, with simulated workers
    python bench/bench_es_scale.py --report docs/perf/es_scale   # also STEM.md and STEM.png

ES (OpenAI-style, antithetic sampling) with a shared noise table: each generation the master
sends theta and an offset into the table for each of population/2 pairs; a worker reads its
perturbation from the table it was given once (``initargs``), and each evaluation costs a
fixed CPU time (``--eval-ms``, a stand-in for a simulator's episode). Per library and N it
reports: time to all workers ready, seconds per generation (median), the master's CPU per
generation, its RSS and open descriptors, and the workers' own memory (USS, mean and total).

The same program runs on every library: ``Pool(N, initializer, initargs=(table,))``.
multiprocessing's fork children share the table by fork; its spawn children each receive a
copy (run only while N copies fit in half this machine's memory); fibercore keeps one copy in
/dev/shm, mapped by every worker (``pool_share_initargs``).

``--simulate``: fibercore's master with N simulated workers (clients speaking the real pool
protocol, many per job, no work), to show the master's CPU per task beyond the workers this
machine can hold. A benchmark, not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _es_tasks as T
from _pool_clients import serve_as_workers

POPULATION = 2048
DIM = 256  # a small policy: theta of 256 floats
SIGMA = 0.02
LR = 0.01


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _uss_kib(pid: int) -> int:
    total = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith(("Private_Clean", "Private_Dirty")):
                    total += int(line.split()[1])
    except OSError:
        return 0
    return total


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _cpu() -> float:
    """This process's CPU time (all its threads)."""
    return time.process_time()


def generation(pool: Any, theta: np.ndarray, table: np.ndarray, rng: np.random.Generator,
               chunksize: int) -> np.ndarray:
    """One ES generation on ``pool``: POPULATION/2 antithetic pairs evaluated by the workers
    (perturbations read from their table at the offsets sent), the step taken here; the new theta."""
    offsets = rng.integers(0, table.size - DIM, size=POPULATION // 2)
    results = pool.map(T.evaluate, [(theta, int(o), SIGMA) for o in offsets], chunksize=chunksize)
    pos = np.array([r[0] for r in results])
    neg = np.array([r[1] for r in results])
    weights = (pos - neg) / (np.std(np.concatenate([pos, neg])) + 1e-8)
    step = np.zeros(DIM)
    for w, o in zip(weights, offsets, strict=True):
        step += w * table[o:o + DIM]
    return theta + LR / (POPULATION * SIGMA) * step


def run(name: str, lib: Any, n: int, table: np.ndarray, generations: int, eval_s: float) -> dict[str, Any]:
    """One library at N workers: the ES loop, measured."""
    rng = np.random.default_rng(0)
    theta = np.zeros(DIM)
    t0 = time.perf_counter()
    pool = lib.Pool(n, initializer=T.init_worker, initargs=(table, eval_s))
    try:
        if hasattr(pool, "wait_until_workers_up"):  # fibercore: its own way to know
            pool.wait_until_workers_up(600)
        ready, pids = _all_ready(pool, n, t0)
        times, cpus = [], []
        for _ in range(generations):
            g0, c0 = time.perf_counter(), _cpu()
            theta = generation(pool, theta, table, rng, chunksize=1)
            times.append(time.perf_counter() - g0)
            cpus.append(_cpu() - c0)
        uss = [_uss_kib(pid) for pid in pids]
        row = {
            "library": name, "N": n, "workers_seen": len(pids), "ready_s": ready,
            "gen_s": statistics.median(times), "master_cpu_gen_s": statistics.median(cpus),
            "master_rss_mib": _status_kib(os.getpid(), "VmRSS") / 1024, "master_fds": _fds(),
            "worker_uss_mib": statistics.mean(uss) / 1024 if uss else float("nan"),
            "workers_uss_total_mib": sum(uss) / 1024,
        }
    finally:
        pool.terminate()
        pool.join()
    return row


def _all_ready(pool: Any, n: int, t0: float) -> tuple[float, set[int]]:
    """Seconds from ``t0`` until all ``n`` workers run a task, and their pids: a map of n tasks
    that each wait long enough for every worker to take one (tried again, waiting longer,
    while some worker took two)."""
    wait = 0.3
    while True:
        started = time.perf_counter()
        pids = set(pool.map(T.hello, [wait] * n, chunksize=1))
        if len(pids) == n or wait > 60:
            return started - t0 + (time.perf_counter() - started - wait), pids
        wait *= 2


def _fits(lib_name: str, n: int, table: np.ndarray) -> bool:
    """Whether N workers of this library fit in 80% of the memory available: every worker
    holds 3-10 MB of its own (measured: fork 3-4, fibercore 9-10), a spawn child a copy of the
    table besides."""
    avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    per_worker = 16 << 20
    if lib_name == "spawn":
        per_worker += table.nbytes
    return n * per_worker < avail * 0.8


# -------------------------------------------------------------------------------- simulated workers
def simulate(n: int, generations: int, per_job: int = 128) -> dict[str, Any]:
    """fibercore's master with ``n`` simulated workers: ES generations of POPULATION/2 tasks."""
    import fibercore

    pool = fibercore.Pool(1, initializer=T.init_worker, initargs=(np.zeros(POPULATION // 2 + DIM), 0.0))
    core = pool._core
    with core.lock:  # slots for clients the pool does not start (this harness reaches in on purpose)
        wids = core.fleet.reserve(n)
    jobs = []
    t0 = time.perf_counter()
    for i in range(0, n, per_job):
        p = fibercore.Process(target=serve_as_workers, args=(core.address, wids[i:i + per_job], "es_pairs"),
                              daemon=True)
        p.start()
        jobs.append(p)
    while core.ready_count() < n + 1 and time.perf_counter() - t0 < 600:
        time.sleep(0.1)
    ready = time.perf_counter() - t0
    theta = np.zeros(DIM)
    times, cpus = [], []
    try:
        for _ in range(generations):
            g0, c0 = time.perf_counter(), _cpu()
            pool.map(T.evaluate, [(theta, i, SIGMA) for i in range(POPULATION // 2)], chunksize=1)
            times.append(time.perf_counter() - g0)
            cpus.append(_cpu() - c0)
        return {"library": "fibercore (simulated)", "N": n, "workers_seen": core.ready_count() - 1,
                "ready_s": ready, "gen_s": statistics.median(times), "master_cpu_gen_s": statistics.median(cpus),
                "master_cpu_task_us": statistics.median(cpus) / (POPULATION // 2) * 1e6,
                "master_rss_mib": _status_kib(os.getpid(), "VmRSS") / 1024, "master_fds": _fds(),
                "worker_uss_mib": float("nan"), "workers_uss_total_mib": float("nan")}
    finally:
        pool.terminate()
        for p in jobs:
            p.kill()
            p.join(10)


# ---------------------------------------------------------------------------------------- output
COLUMNS = [("library", "library", "{}"), ("N", "N", "{}"), ("workers seen", "workers_seen", "{}"),
           ("ready (s)", "ready_s", "{:.1f}"), ("s / generation", "gen_s", "{:.2f}"),
           ("master CPU / gen (s)", "master_cpu_gen_s", "{:.3f}"), ("master RSS (MiB)", "master_rss_mib", "{:.0f}"),
           ("master fds", "master_fds", "{}"), ("worker USS (MiB)", "worker_uss_mib", "{:.1f}"),
           ("workers' USS total (MiB)", "workers_uss_total_mib", "{:.0f}")]


def table_md(rows: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for row in rows:
        lines.append("| " + " | ".join(fmt.format(row[key]) for _, key, fmt in COLUMNS) + " |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: str, eval_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for lib in dict.fromkeys(r["library"] for r in rows):
        mine = [r for r in rows if r["library"] == lib]
        ns = [r["N"] for r in mine]
        left.plot(ns, [r["gen_s"] for r in mine], marker="o", label=lib)
        right.plot(ns, [r["master_cpu_gen_s"] for r in mine], marker="o", label=lib)
    ideal = POPULATION * eval_s / (os.cpu_count() or 1)
    left.axhline(ideal, color="grey", linestyle=":", label=f"all CPUs busy ({ideal:.2f} s)")
    for ax, title in ((left, "seconds per generation"), (right, "master CPU per generation (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("workers (N)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    left.legend(fontsize=8)
    fig.suptitle(f"ES, population {POPULATION}, {eval_s * 1000:g} ms CPU per evaluation, "
                 f"{os.cpu_count()} CPUs")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="32,64,128,256,512,1024")
    parser.add_argument("--libraries", default="fibercore,fork,spawn")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--eval-ms", type=float, default=1.0, help="CPU time of one evaluation")
    parser.add_argument("--table-mb", type=int, default=100, help="size of the shared noise table")
    parser.add_argument("--simulate", default="", help="N of simulated workers (fibercore's master only)")
    parser.add_argument("--report", metavar="STEM", help="write STEM.md (table) and STEM.png (plot)")
    args = parser.parse_args()
    eval_s = args.eval_ms / 1000
    import fibercore

    libs = {"fibercore": fibercore, "fork": multiprocessing.get_context("fork"),
            "spawn": multiprocessing.get_context("spawn")}
    table = np.random.default_rng(123).standard_normal(args.table_mb * (1 << 20) // 4, dtype=np.float32)
    print(f"bench_es_scale: {os.cpu_count()} CPUs, population {POPULATION}, {args.eval_ms:g} ms an evaluation, "
          f"noise table {table.nbytes >> 20} MiB", flush=True)
    rows: list[dict[str, Any]] = []
    for n in [int(x) for x in args.workers.split(",") if x]:
        for name in args.libraries.split(","):
            if not _fits(name, n, table):
                print(f"  {name} N={n}: skipped (would not fit in memory)", flush=True)
                continue
            row = run(name, libs[name], n, table, args.generations, eval_s)
            rows.append(row)
            print("  " + ", ".join(f"{c[0]} " + c[2].format(row[c[1]]) for c in COLUMNS[1:]) + f"  [{name}]",
                  flush=True)
    sim = []
    for n in [int(x) for x in args.simulate.split(",") if x]:
        row = simulate(n, args.generations)
        sim.append(row)
        print(f"  simulated N={n}: ready {row['ready_s']:.1f} s, {row['gen_s']:.2f} s a generation, master CPU "
              f"{row['master_cpu_task_us']:.0f} us a task, RSS {row['master_rss_mib']:.0f} MiB, "
              f"{row['master_fds']} fds", flush=True)
    text = table_md(rows)
    if sim:
        text += "\n\nSimulated workers (fibercore's master only; tasks answered at once):\n\n"
        text += "| N | ready (s) | s / generation | master CPU / task (µs) | master RSS (MiB) | master fds |\n"
        text += "|---|---|---|---|---|---|\n"
        text += "\n".join(f"| {r['N']} | {r['ready_s']:.1f} | {r['gen_s']:.2f} | {r['master_cpu_task_us']:.0f} | "
                          f"{r['master_rss_mib']:.0f} | {r['master_fds']} |" for r in sim)
    print("\n" + text)
    if args.report:
        with open(args.report + ".md", "w") as fh:
            fh.write(f"bench_es_scale, {time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs, population "
                     f"{POPULATION}, {args.eval_ms:g} ms CPU per evaluation, noise table "
                     f"{table.nbytes >> 20} MiB\n\n{text}\n")
        if rows:
            plot(rows, args.report + ".png", eval_s)


if __name__ == "__main__":
    main()
