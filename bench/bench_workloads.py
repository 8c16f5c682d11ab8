"""Real workloads, fibercore vs multiprocessing (spawn and fork), side by side in one run.

    python bench/bench_workloads.py            # both workloads, 3 rounds each
    python bench/bench_workloads.py --rounds 5 es

Sections (ratio = time of the library / time of multiprocessing spawn; target ≤ 1.10):
  es    evolution strategies on gymnasium's CartPole-v1: a linear policy, a shared noise
        table (a numpy global of ``__main__`` that the task reads, as ES code does),
        antithetic pairs, ``pool.map(evaluate, population)`` per generation
  cma   pycma (CMA-ES) on a 40-dimensional Rastrigin function made expensive the way
        simulators are (each evaluation ~4 ms of numpy and Python), ``pool.map`` per ask

What users time is the task running inside a worker: the pools are created and warmed
up once per library, then generations are timed; rounds interleave the libraries (each
goes first in turn) so that a noisy neighbour hurts all of them alike. Workers: 2 (this machine has 2 cores).
The task functions live in this ``__main__`` on purpose: that is how user scripts
are written, and it is the path that pickles functions by value.

BLAS threads: numpy's OpenBLAS starts one thread per core in every process, and they
spin for a while after each call. ES and RL code pins them to 1 (OpenAI's ES starter,
baselines), and so does this benchmark by default, for every library alike
(``--blas-threads 0`` keeps the library default: on 2 cores the master's spinning BLAS
thread then competes with both workers, and pycma's ratio was 1.14 against 1.04).

A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
import warnings


def _blas_threads() -> None:
    """Apply --blas-threads before numpy loads (children inherit the environment)."""
    value = "1"
    for i, arg in enumerate(sys.argv):
        if arg == "--blas-threads" and i + 1 < len(sys.argv):
            value = sys.argv[i + 1]
        elif arg.startswith("--blas-threads="):
            value = arg.split("=", 1)[1]
    if value != "0":
        for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, value)


if __name__ == "__main__":
    _blas_threads()

import numpy as np  # noqa: E402

warnings.filterwarnings("ignore", message="Could not import matplotlib")

WORKERS = 2
NOISE = np.random.default_rng(0).standard_normal(2_000_000).astype(np.float32)
OBS, ACT = 4, 2
SIGMA = 0.05
POP = 48  # candidates per generation (24 antithetic pairs)
EPISODES = 2

_env = None


def _get_env():
    """One environment per worker process, built on first use (a module-level cache)."""
    global _env
    if _env is None:
        import gymnasium

        _env = gymnasium.make("CartPole-v1")
    return _env


def es_evaluate(args: tuple[np.ndarray, int, int]) -> float:
    """Return of the policy theta + sign * sigma * noise[offset:...] over EPISODES episodes."""
    theta, offset, sign = args
    w = (theta + sign * SIGMA * NOISE[offset:offset + theta.size]).reshape(ACT, OBS)
    env = _get_env()
    total = 0.0
    for episode in range(EPISODES):
        obs, _ = env.reset(seed=offset + episode)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(int(np.argmax(w @ obs)))
            total += reward
            done = terminated or truncated
    return total


def es_generation(pool, theta: np.ndarray, gen: int) -> np.ndarray:
    rng = np.random.default_rng(gen)
    offsets = rng.integers(0, NOISE.size - theta.size, POP // 2)
    tasks = [(theta, int(o), s) for o in offsets for s in (1, -1)]
    returns = np.array(pool.map(es_evaluate, tasks))
    diffs = returns[0::2] - returns[1::2]
    grad = sum(d * NOISE[o:o + theta.size] for d, o in zip(diffs, offsets, strict=True))
    return theta + 0.02 / (POP * SIGMA) * grad


def rastrigin_costly(x: np.ndarray) -> float:
    """Rastrigin, computed 300 times (a stand-in for a simulator: ~4 ms of numpy and Python)."""
    value = 0.0
    for _ in range(300):
        value = 10.0 * x.size + float(np.sum(x * x - 10.0 * np.cos(2 * np.pi * x)))
    return value


def cma_run(pool, iterations: int) -> float:
    import cma

    es = cma.CMAEvolutionStrategy(40 * [2.0], 0.5, {"seed": 1, "verbose": -9, "popsize": 24})
    for _ in range(iterations):
        xs = es.ask()
        es.tell(xs, pool.map(rastrigin_costly, xs))
    return float(es.result.fbest)


# ------------------------------------------------------------------------------ harness
def libraries():
    import fibercore

    return [("fibercore", fibercore), ("mp spawn", multiprocessing.get_context("spawn")),
            ("mp fork", multiprocessing.get_context("fork"))]


def measure(rounds: int, section: str) -> dict[str, list[float]]:
    pools = {}
    for name, lib in libraries():
        pools[name] = lib.Pool(WORKERS)
        pools[name].map(abs, range(WORKERS * 4))  # started and connected
    times: dict[str, list[float]] = {name: [] for name in pools}
    try:
        for pool in pools.values():  # warm-up: imports, environments, caches
            if section == "es":
                es_generation(pool, np.zeros(OBS * ACT), 0)
            else:
                cma_run(pool, 1)
        names = list(pools)
        for r in range(rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:  # each goes first in turn
                pool = pools[name]
                t0 = time.perf_counter()
                if section == "es":
                    theta = np.zeros(OBS * ACT)
                    for gen in range(5):
                        theta = es_generation(pool, theta, 1000 * r + gen)
                else:
                    cma_run(pool, 10)
                times[name].append(time.perf_counter() - t0)
    finally:
        for pool in pools.values():
            pool.terminate()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="*", help="es, cma (default: both)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blas-threads", type=int, default=1, help="threads of numpy's BLAS (0: its default)")
    args = parser.parse_args()
    args.sections = args.sections or ["es", "cma"]
    if set(args.sections) - {"es", "cma"}:
        parser.error("sections are es and cma")
    what = {"es": "ES, 5 generations x 48 CartPole candidates", "cma": "pycma, 10 iterations x 24 Rastrigin"}
    print(f"{os.cpu_count()} CPUs, {WORKERS} workers, BLAS threads {args.blas_threads or 'default'}, "
          f"median of {args.rounds} rounds; ratio to mp spawn")
    for section in args.sections:
        times = measure(args.rounds, section)
        base = statistics.median(times["mp spawn"])
        print(f"{what[section]}:")
        for name, values in times.items():
            med = statistics.median(values)
            print(f"  {name:<10} {med:8.3f} s  ratio {med / base:5.2f}", flush=True)


if __name__ == "__main__":
    main()
