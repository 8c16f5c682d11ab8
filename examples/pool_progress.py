"""A progress bar over a job-backed Pool: ``imap``/``imap_unordered`` yield as results arrive.

    pip install tqdm        # optional; without it a plain counter is printed
    scripts/run examples/pool_progress.py
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
        results = pool.imap_unordered(work, items, chunksize=4)
        try:
            from tqdm import tqdm
        except ImportError:
            total = 0
            for i, _ in enumerate(results, 1):
                total += 1
                if i % 100 == 0:
                    print(f"{i}/{len(items)} done")
        else:
            total = sum(1 for _ in tqdm(results, total=len(items)))
    print(f"{total} results")


if __name__ == "__main__":
    main()
