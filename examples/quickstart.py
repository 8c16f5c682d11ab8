"""Estimate pi with job-backed processes: the same code runs on any backend.

    scripts/run                                # local processes
    FIBER_BACKEND=docker scripts/run           # one container per process
"""

import random
import time

import fibercore as mp


def sample(n: int, seed: int, results: "mp.Queue") -> None:
    rng = random.Random(seed)
    inside = sum(rng.random() ** 2 + rng.random() ** 2 <= 1.0 for _ in range(n))
    results.put((mp.current_process().name, inside))


def main() -> None:
    n, workers = 200_000, 4
    results = mp.Queue()
    t0 = time.perf_counter()
    procs = [mp.Process(target=sample, args=(n, seed, results)) for seed in range(workers)]
    for p in procs:
        p.start()
    total = 0
    for _ in procs:
        name, inside = results.get(timeout=120)
        print(f"{name}: {inside}/{n} inside")
        total += inside
    for p in procs:
        p.join()
    print(f"pi ~ {4 * total / (n * workers):.5f} with {workers} jobs on backend "
          f"{mp.get_runtime().backend!r} in {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
