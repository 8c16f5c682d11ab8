"""The floor of a Pipe step: fibercore against multiprocessing's three start methods, on one CPU.

One child echoes a CartPole-sized observation for each small int the master sends, pinned to
one CPU so that what is measured is CPU, not the wake-up of an idle one. Each variant runs in
a fresh process. A connected fibercore end sends and reads through its line
(:mod:`fibercore.pipes.line`), which executes about as many instructions per step as
multiprocessing (``valgrind --tool=callgrind`` counts them: see docs/performance.md); what is
left between them on one CPU is memory: a forked child shares its parent's pages (and so its
caches), a spawned one or a fibercore job has pages of its own.

    taskset -c 0 python bench/pipe_floor.py [round_trips]

Prints each variant's round trip and each side's user and system time per round trip (from
``/proc``, clock ticks over the whole run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any


def echo(conn: Any) -> None:
    """The child: answer each int with an observation, until None."""
    import numpy as np

    conn.send("ready")
    obs = np.zeros(4, dtype=np.float32)
    while conn.recv() is not None:
        conn.send((obs, 1.0, False, False))


def _times(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def run(variant: str, steps: int) -> None:
    """One variant in this process: print its round trip and CPU per round trip."""
    import multiprocessing

    import fibercore

    lib: Any = fibercore if variant == "fibercore" else multiprocessing.get_context(variant)
    a, b = lib.Pipe()
    child = lib.Process(target=echo, args=(b,), daemon=True)
    child.start()
    b.close()
    assert a.recv() == "ready"
    for _ in range(2000):
        a.send(1)
        a.recv()
    pids = [os.getpid(), child.pid]
    before = [_times(p) for p in pids]
    started = time.perf_counter()
    for _ in range(steps):
        a.send(1)
        a.recv()
    elapsed = time.perf_counter() - started
    after = [_times(p) for p in pids]
    a.send(None)
    child.join(10)
    tick = os.sysconf("SC_CLK_TCK")
    per = [((x[0] - y[0]) / tick / steps * 1e6, (x[1] - y[1]) / tick / steps * 1e6)
           for y, x in zip(before, after, strict=True)]
    cpu = f"master user {per[0][0]:4.1f} sys {per[0][1]:4.1f}  child user {per[1][0]:4.1f} sys {per[1][1]:4.1f}"
    print(f"{variant:9} {elapsed / steps * 1e6:5.1f} us per round trip   {cpu}  (us)", flush=True)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    for variant in ("fibercore", "fork", "spawn", "forkserver"):
        subprocess.run([sys.executable, __file__, "--variant", variant, str(steps)], check=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--variant":
        run(sys.argv[2], int(sys.argv[3]))
    else:
        main()
