"""fibercore.ParameterServer against the parameter server users write by hand on multiprocessing.

    python bench/bench_paramserver.py                  # 2 and 8 workers (cores and 4x cores), 3 rounds
    python bench/bench_paramserver.py --workers 2,8,64 --size 1000,1000000 --rounds 5

The hand-written one is what the issue's users write today: BSP, a master that sends the
parameters to every worker over its Pipe, receives every gradient, averages and applies;
asynchronous, a master that applies each gradient as it arrives and answers that worker
with the new parameters. It runs on multiprocessing (fork, spawn) and, unchanged, on
fibercore (its Pipes). fibercore.ParameterServer runs the same workers' loop through
``pull``/``push``. Reported: rounds/s (BSP: versions published per second; asynchronous:
gradients applied per second), with parameters of ``--size`` float32s, each gradient taking
``--work`` seconds of CPU. Ratios are fibercore's / multiprocessing fork's: higher is better.
A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from typing import Any

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _ps_tasks as T  # noqa: E402
import numpy as np  # noqa: E402

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def hand_bsp(ctx: Any, workers: int, rounds: int, size: int, work: float) -> float:
    """Versions/s of the hand-written BSP master over Pipes."""
    w = np.zeros(size, dtype=np.float32)
    ends = [ctx.Pipe() for _ in range(workers)]
    procs = [ctx.Process(target=T.pipe_worker, args=(child, rounds, work)) for _, child in ends]
    for p in procs:
        p.start()
    started = None
    for r in range(rounds):
        if r == 1:
            started = time.perf_counter()  # round 0 includes start-up
        for parent, _ in ends:
            parent.send(w)
        grads = [parent.recv() for parent, _ in ends]
        w = w - 0.01 * np.mean(grads, axis=0)
    elapsed = time.perf_counter() - (started or time.perf_counter())
    for p in procs:
        p.join()
    return (rounds - 1) / elapsed


def hand_async(ctx: Any, workers: int, rounds: int, size: int, work: float) -> float:
    """Gradients applied per second by the hand-written asynchronous master."""
    from multiprocessing.connection import wait

    w = np.zeros(size, dtype=np.float32)
    ends = [ctx.Pipe() for _ in range(workers)]
    procs = [ctx.Process(target=T.async_worker, args=(child, rounds, work)) for _, child in ends]
    for p in procs:
        p.start()
    parents = [parent for parent, _ in ends]
    for parent in parents:
        parent.send(w)
    if ctx is _fibercore():
        from fibercore.connection import wait as wait_on
    else:
        wait_on = wait
    # A worker closes its end after its last round: stop waiting on it then (a fibercore
    # end reads EOF once the copy that wrote to it is closed, see multiprocessing-compat.md).
    served = dict.fromkeys(parents, 0)
    applied, started = 0, time.perf_counter()
    while served:
        for parent in wait_on(list(served)):
            w = w - 0.01 * parent.recv()
            applied += 1
            parent.send(w)
            served[parent] += 1
            if served[parent] == rounds:
                del served[parent]
    elapsed = time.perf_counter() - started
    for p in procs:
        p.join()
    return applied / elapsed


def ps_run(staleness: int, workers: int, rounds: int, size: int, work: float) -> float:
    """fibercore.ParameterServer: versions/s (BSP) or gradients applied/s (asynchronous)."""
    mp = _fibercore()
    ps = mp.ParameterServer({"w": np.zeros(size, dtype=np.float32)}, staleness=staleness, workers=workers)
    procs = [mp.Process(target=T.ps_worker, args=(ps, rounds, work)) for _ in range(workers)]
    for p in procs:
        p.start()
    # Timed from the first version on (the start-up of the jobs is not the server's cost).
    _, first = ps.params(newer_than=0)
    started = time.perf_counter()
    for p in procs:
        p.join()
    elapsed = time.perf_counter() - started
    return (ps.version - first) / elapsed


def _fibercore() -> Any:
    import fibercore

    return fibercore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default=f"{CORES},{4 * CORES}")
    parser.add_argument("--size", default="1000", help="parameter float32s, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions (medians are reported)")
    parser.add_argument("--steps", type=int, default=200, help="rounds per worker (BSP)")
    parser.add_argument("--work", type=float, default=0.0, help="CPU seconds per gradient")
    args = parser.parse_args()
    mp = _fibercore()
    rows = []
    for size in [int(s) for s in args.size.split(",")]:
        for n in [int(s) for s in args.workers.split(",")]:
            cases = {
                "BSP ParameterServer": lambda n=n, size=size: ps_run(0, n, args.steps, size, args.work),
                "BSP by hand, fibercore": lambda n=n, size=size: hand_bsp(mp, n, args.steps, size, args.work),
                "BSP by hand, fork": lambda n=n, size=size: hand_bsp(multiprocessing.get_context("fork"), n,
                                                                     args.steps, size, args.work),
                "BSP by hand, spawn": lambda n=n, size=size: hand_bsp(multiprocessing.get_context("spawn"), n,
                                                                      args.steps, size, args.work),
                "async ParameterServer": lambda n=n, size=size: ps_run(-1, n, args.steps, size, args.work),
                "async by hand, fibercore": lambda n=n, size=size: hand_async(mp, n, args.steps, size, args.work),
                "async by hand, fork": lambda n=n, size=size: hand_async(multiprocessing.get_context("fork"), n,
                                                                         args.steps, size, args.work),
            }
            values: dict[str, list[float]] = {k: [] for k in cases}
            for r in range(args.rounds):
                names = list(cases)
                names = names[r % len(names):] + names[:r % len(names)]  # rotate who goes first
                for name in names:
                    values[name].append(cases[name]())
            med = {k: statistics.median(v) for k, v in values.items()}
            for k, v in med.items():
                mode = k.split()[0]
                base = med[f"{mode} by hand, fork"]
                rows.append((size, n, k, v, v / base))
                print(f"size {size:>8} workers {n:>4} {k:<26} {v:>9.1f}/s  {v / base:5.2f}x fork", flush=True)
    print("\n| params | workers | what | per second | vs fork by hand |\n|---|---|---|---|---|")
    for size, n, k, v, ratio in rows:
        print(f"| {size:,} | {n} | {k} | {v:,.0f} | {ratio:.2f}x |")


if __name__ == "__main__":
    main()
