# requires: nothing beyond fibercore
"""concurrent.futures on fibercore jobs: ProcessPoolExecutor with fibercore's context.

    scripts/run examples/futures_executor.py

The executor is the standard library's own; ``mp_context=fibercore.get_context()`` makes its
worker processes jobs on the selected backend (local processes here; containers, pods or
Batch jobs with FIBER_BACKEND).
"""

from __future__ import annotations

import concurrent.futures as cf
import math

import fibercore


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    return all(n % d for d in range(2, math.isqrt(n) + 1))


def main() -> int:
    numbers = [112272535095293, 112582705942171, 112272535095293, 115280095190773,
               115797848077099, 1099726899285419, 17, 18]
    with cf.ProcessPoolExecutor(max_workers=2, mp_context=fibercore.get_context()) as ex:
        for n, prime in zip(numbers, ex.map(is_prime, numbers), strict=True):
            print(f"{n} is prime: {prime}")
        futures = {ex.submit(pow, 2, k): k for k in (10, 20, 30)}
        for fut in cf.as_completed(futures):
            print(f"2**{futures[fut]} = {fut.result()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
