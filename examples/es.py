# requires: nothing beyond fibercore
"""Evolution strategies with a job-backed Pool: the paper's ``pool.map(evaluate, thetas)``.

    scripts/run examples/es.py                  # local processes
    FIBER_BACKEND=docker scripts/run examples/es.py

Each generation perturbs the parameters with Gaussian noise, evaluates every perturbation
in the pool (a task per candidate; a dead worker's tasks are rerun), and moves the
parameters along the fitness-weighted noise.
"""

from __future__ import annotations

import math
import random
import time

import fibercore as mp

DIM, POPULATION, SIGMA, LR = 10, 48, 0.1, 0.05


def rastrigin(theta: list[float]) -> float:
    """Fitness to maximise: minus the Rastrigin function (optimum 0 at the origin)."""
    return -(10 * len(theta) + sum(x * x - 10 * math.cos(2 * math.pi * x) for x in theta))


def evaluate(args: tuple[list[float], int]) -> float:
    theta, seed = args
    rng = random.Random(seed)
    return rastrigin([x + SIGMA * rng.gauss(0, 1) for x in theta])


def main(generations: int = 30) -> None:
    theta = [random.Random(0).uniform(-2, 2) for _ in range(DIM)]
    t0 = time.perf_counter()
    with mp.Pool(4) as pool:
        for gen in range(generations):
            seeds = [gen * POPULATION + i for i in range(POPULATION)]
            fitness = pool.map(evaluate, [(theta, s) for s in seeds])
            mean = sum(fitness) / len(fitness)
            std = (sum((f - mean) ** 2 for f in fitness) / len(fitness)) ** 0.5 or 1.0
            step = [0.0] * DIM
            for f, s in zip(fitness, seeds, strict=True):
                rng = random.Random(s)
                noise = [rng.gauss(0, 1) for _ in range(DIM)]
                step = [a + (f - mean) / std * n for a, n in zip(step, noise, strict=True)]
            theta = [x + LR / (POPULATION * SIGMA) * g for x, g in zip(theta, step, strict=True)]
            if gen % 5 == 0 or gen == generations - 1:
                print(f"generation {gen:3d}: fitness {rastrigin(theta):9.3f}")
        print(f"{generations} generations x {POPULATION} evaluations on {pool.size} workers "
              f"(backend {mp.get_runtime().backend!r}) in {time.perf_counter() - t0:.2f} s")


if __name__ == "__main__":
    main()
