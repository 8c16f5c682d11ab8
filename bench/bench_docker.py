"""Docker backend benchmarks: containers vs local processes, side by side in one run.

    python bench/bench_docker.py --image fibercore-worker:latest
    python bench/bench_docker.py --image IMG start          # chosen sections only

Needs a reachable dockerd and a worker image (``python -m fiber_docker.image``; the
test suite's image works too: ``docker images fibercore-test/worker``). Run it from
the checkout's root so that the image finds bench/_tasks.py through the mounted cwd.

Sections (issue "fiber-docker"; ratio = docker / local):
  start     Pool(N) for N = 1, 8, 32: time to the first result and until all N
            workers are ready (N containers started and connected)
  overhead  the paper's framework overhead test on containers: 5 workers, 5/d tasks
            sleeping d (d = 1 ms and 10 ms), ideal 1 s

A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _tasks
import bench_pool

import fibercore

ROWS: list[tuple[str, str, float, float]] = []


def record(name: str, unit: str, docker: float, local: float) -> None:
    ROWS.append((name, unit, docker, local))
    print(f"  {name:<36} docker {docker:>9.4g} {unit:<3} local {local:>9.4g} {unit:<3} ratio {docker / local:6.2f}",
          flush=True)


def on(backend: str, image: str, **extra):
    config = {"image": image, "docker_echo_output": False} if backend == "docker" else {}
    fibercore.init(backend=backend, **config, **extra)


def start(n: int) -> tuple[float, float]:
    """Seconds from Pool(n) to the first result, and until all n workers are ready."""
    t0 = time.perf_counter()
    pool = fibercore.Pool(n)
    pool.apply(_tasks.noop, (1,))
    first = time.perf_counter() - t0
    core = pool._core
    while core.ready_count() < n:
        time.sleep(0.005)
    ready = time.perf_counter() - t0
    pool.terminate()
    pool.join()
    return first, ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="*", default=["start", "overhead"])
    parser.add_argument("--image", default=os.environ.get("FIBER_IMAGE", "fibercore-worker:latest"))
    parser.add_argument("--sizes", default="1,8,32", help="pool sizes of the start section")
    parser.add_argument("--repeat", type=int, default=3, help="runs per measurement (the median is reported)")
    parser.add_argument("--concurrency", type=int, default=None,
                        help="pool_start_concurrency for both backends (default: each backend's)")
    args = parser.parse_args()
    extra = {} if args.concurrency is None else {"pool_start_concurrency": args.concurrency}
    print(f"bench_docker on {os.cpu_count()} CPUs, image {args.image}", flush=True)

    def median(backend: str, fn, *a):
        runs = []
        for _ in range(args.repeat):
            on(backend, args.image, **extra)
            runs.append(fn(*a))
        runs.sort()
        return runs[len(runs) // 2]

    if "start" in args.sections:
        print(f"start (median of {args.repeat}):")
        for n in (int(s) for s in args.sizes.split(",")):
            d_first, d_ready = median("docker", start, n)
            l_first, l_ready = median("local", start, n)
            record(f"Pool({n}) to first result", "s", d_first, l_first)
            record(f"Pool({n}) all {n} workers ready", "s", d_ready, l_ready)
    if "overhead" in args.sections:
        print("framework overhead (5 workers, 5/d tasks of d; ideal 1 s):")
        for d in (0.01, 0.001):
            record(f"overhead d={d * 1000:g} ms", "s", median("docker", bench_pool.overhead, fibercore, d),
                   median("local", bench_pool.overhead, fibercore, d))
    if ROWS:
        print("\n| measurement | docker | local | ratio |\n|---|---|---|---|")
        for name, unit, docker, local in ROWS:
            print(f"| {name} | {docker:.3g} {unit} | {local:.3g} {unit} | {docker / local:.2f} |")


if __name__ == "__main__":
    main()
