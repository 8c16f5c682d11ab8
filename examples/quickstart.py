# requires: nothing beyond fibercore
"""Estimate pi with job-backed processes: the same code runs on any backend.

    scripts/run                                # local processes
    FIBER_BACKEND=docker scripts/run           # one container per process
"""

import random
import time

import fibercore as mp


def count_inside(n: int, seed: int) -> int:
    rng = random.Random(seed)
    return sum(rng.random() ** 2 + rng.random() ** 2 <= 1.0 for _ in range(n))


def sample(n: int, seed: int, results: "mp.Queue") -> None:
    results.put((mp.current_process().name, count_inside(n, seed)))


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

    # The same estimate with a Pool: a task per seed, results in order.
    t0 = time.perf_counter()
    with mp.Pool(workers) as pool:
        counts = pool.starmap(count_inside, [(n, seed) for seed in range(workers)])
    print(f"pi ~ {4 * sum(counts) / (n * workers):.5f} with Pool({workers}) in "
          f"{time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
