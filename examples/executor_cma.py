# requires: cma
"""pycma's ask/tell loop with its evaluations on ``fibercore.Executor`` (jobs on the backend).

    scripts/run examples/executor_cma.py                    # Rastrigin in 10-D, 4 workers
    scripts/run examples/executor_cma.py --dim 20 --workers 8 --iterations 60

Any tool that takes a ``concurrent.futures.Executor`` (pycma's own ``EvalParallel2``,
Nevergrad's ``minimize(..., executor=...)``) works the same way. Each iteration submits the
population, and gathers the values with ``fibercore.as_completed`` (each as it finishes).
"""

from __future__ import annotations

import argparse
import math

import cma

import fibercore as mp


def rastrigin(x: list[float]) -> float:
    return 10.0 * len(x) + sum(v * v - 10.0 * math.cos(2 * math.pi * v) for v in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=40)
    args = parser.parse_args()
    es = cma.CMAEvolutionStrategy(args.dim * [2.0], 1.0, {"seed": 1, "verbose": -9})
    first = None
    with mp.Executor(args.workers) as ex:
        for it in range(args.iterations):
            xs = es.ask()
            futures = {ex.submit(rastrigin, list(x)): k for k, x in enumerate(xs)}
            values = [0.0] * len(xs)
            for done in mp.as_completed(futures):
                values[futures[done]] = done.result()
            es.tell(xs, values)
            first = min(values) if first is None else first
            if it % 10 == 0 or it == args.iterations - 1:
                print(f"iteration {it:3d}: best {es.result.fbest:.3f}")
    print(f"first population's best {first:.3f}, final best {es.result.fbest:.3f}")


if __name__ == "__main__":
    main()
