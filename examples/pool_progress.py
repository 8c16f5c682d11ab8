# requires: nothing beyond fibercore
# optional: tqdm (a tqdm bar; without it, a plain counter)
"""A progress bar over a job-backed Pool: one argument (or the config key ``pool_progress``).

    pip install tqdm
    scripts/run examples/pool_progress.py
    FIBER_POOL_PROGRESS=1 scripts/run my_program.py     # every map/imap of every pool

``progress=True`` on a map/imap call (or on the Pool) draws a tqdm bar that advances as
chunks finish on the workers; a dict is passed to tqdm (``progress={"desc": "rollouts"}``).
"""

from __future__ import annotations

import time

import fibercore as mp


def work(x: int) -> int:
    time.sleep(0.01)
    return x * x


def main() -> None:
    items = range(500)
    with mp.Pool(4) as pool:
        total = sum(pool.imap_unordered(work, items, chunksize=4, progress={"desc": "squares"}))
        squares = pool.map(work, range(100), progress=True)
    print(f"sum of {len(items)} squares: {total}; map of 100 gave {len(squares)} results")


if __name__ == "__main__":
    main()
