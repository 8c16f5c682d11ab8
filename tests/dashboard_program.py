"""A program to look at: a Pool working through slow tasks that print, a Queue, a Lock.

Run by tests/test_dashboard.py as a real program (``python dashboard_program.py STOPFILE``):
it works for a while, then waits until STOPFILE exists (at most 120 s) and ends.
"""

from __future__ import annotations

import os
import sys
import time

import fibercore as mp


def task(i: int) -> int:
    time.sleep(0.03)
    print(f"task-{i} done in pid {os.getpid()}", flush=True)
    return i * i


def main() -> None:
    stop = sys.argv[1]
    tasks = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    queue = mp.Queue()
    for i in range(3):
        queue.put(i)
    lock = mp.Lock()
    with mp.Pool(2) as pool:
        pids = pool.map(_pid, range(2))
        print(f"workers {sorted(set(pids))}", flush=True)
        result = pool.map_async(task, range(tasks), chunksize=1)
        deadline = time.monotonic() + 120
        while not os.path.exists(stop) and time.monotonic() < deadline:
            time.sleep(0.1)
        pool.terminate()
    print(f"finished: ready={result.ready()} lock={lock}", flush=True)


def _pid(_: int) -> int:
    time.sleep(0.2)
    return os.getpid()


if __name__ == "__main__":
    main()
