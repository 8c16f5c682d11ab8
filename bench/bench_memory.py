"""Memory of a payload map: fibercore against multiprocessing, each run in a fresh process.

The peers' payload test: a ``Pool(5)`` maps an identity function over 20 items of 10 MB
(numpy arrays, or bytes) and gets them back. Reported per library and method: how much the
master's peak RSS grew during the map (the 200 MB of inputs exist before it, the 200 MB of
results are part of it), and how much a worker grew (its peak RSS after the map less its
peak before; the median of the five: which worker gets a second chunk in flight varies).
Peak RSS only rises, so each run is a process of its own, and the libraries take turns
(``--rounds``), medians reported.

    python bench/bench_memory.py [--rounds 3] [--methods fork,forkserver,spawn] [--report STEM]

Worker peaks compare best with forkserver: its children, like fibercore's jobs (forked from
a template process), do not start with the master's pages; a fork or spawn child's peak RSS
counts the master's 200 MB of inputs at the moment it was made (spawn: Linux keeps the
peak across exec). A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

ITEMS = 20
SIZE = 10 * 2**20


def identity(x: Any) -> Any:
    return x


def peak(_: Any) -> tuple[int, float]:
    time.sleep(0.2)  # every worker answers once
    return os.getpid(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def one_run(library: str, kind: str) -> dict[str, float]:
    """In this process: the master's and the workers' growth in MB for one payload map."""
    import numpy as np

    if library == "fibercore":
        import fibercore as lib
    else:
        import multiprocessing

        lib = multiprocessing.get_context(library)
    if kind == "numpy":
        data: list[Any] = [np.random.default_rng(i).random(SIZE // 8) for i in range(ITEMS)]
    else:
        data = [os.urandom(SIZE) for _ in range(ITEMS)]
    with lib.Pool(5) as pool:
        before_workers = dict(pool.map(peak, range(10), 1))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        out = pool.map(identity, data)
        master = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - before
        after_workers = dict(pool.map(peak, range(10), 1))
    assert len(out) == ITEMS and all(len(a) == len(b) for a, b in zip(out, data, strict=True))
    grew = [after_workers[pid] - before_workers.get(pid, after_workers[pid]) for pid in after_workers]
    return {"master": master, "worker": statistics.median(grew)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", default="fork,forkserver,spawn")
    parser.add_argument("--report", metavar="STEM", help="also write STEM.md (the table)")
    parser.add_argument("--one", nargs=2, metavar=("LIBRARY", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(*args.one)))
        return 0
    libraries = ["fibercore", *args.methods.split(",")]
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.rounds):
        for kind in ("numpy", "bytes"):
            for library in libraries:
                run = subprocess.run([sys.executable, __file__, "--one", library, kind], capture_output=True,
                                     text=True, check=True)
                results.setdefault((library, kind), []).append(json.loads(run.stdout.strip().splitlines()[-1]))
    lines = [f"`python bench/bench_memory.py --rounds {args.rounds}`: Pool(5) maps an identity over "
             f"{ITEMS} items of {SIZE >> 20} MB; MB each peak grew during the map, medians of the rounds; "
             "ratio = fibercore / that method.", "",
             "| items | what | " + " | ".join(libraries) + " | " + " | ".join(f"ratio to {m}" for m in libraries[1:])
             + " |", "|---" * (2 + 2 * len(libraries) - 1) + "|"]
    for kind in ("numpy", "bytes"):
        for what in ("master", "worker"):
            values = [statistics.median(r[what] for r in results[(lib, kind)]) for lib in libraries]
            ratios = [f"{values[0] / v:.2f}x" if v > 0 else "n/a" for v in values[1:]]
            lines.append(f"| {kind} | {what} | " + " | ".join(f"{v:.0f}" for v in values) + " | "
                         + " | ".join(ratios) + " |")
    table = "\n".join(lines)
    print(table)
    if args.report:
        with open(args.report + ".md", "w") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
