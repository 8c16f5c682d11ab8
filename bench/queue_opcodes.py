"""Python bytecodes a Queue round trip executes in the master, per thread, fibercore against
multiprocessing: a count that does not move with the machine's load.

The master puts 100 bytes on one Queue, a child gets it and puts it on a second Queue, the
master gets it (``bench_rl.py queue``). ``sys.settrace`` with opcode events counts every
bytecode the master's threads run during N round trips (the child runs untraced, in its own
process); the count per round trip is printed per thread, then the functions that cost most.

    python bench/queue_opcodes.py [N]      # about 20 s; TOP=40 lists 40 functions (15 by default)

Not counted: C code (pickling, syscalls, locks), the child, waiting. Tracing slows the run
about tenfold, so only the counts mean anything, not the times.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import sys
import threading
from types import FrameType
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _rl_tasks as T

COUNTS: collections.Counter[tuple[str, str]] = collections.Counter()
COUNTING = [False]


def _tracer(frame: FrameType, event: str, arg: Any) -> Any:
    if event == "call":
        frame.f_trace_opcodes = True
    elif event == "opcode" and COUNTING[0]:
        code = frame.f_code
        thread = threading.current_thread().name
        thread = "queue thread" if thread.startswith("fiber-queue-") else thread
        COUNTS[(thread, f"{os.path.basename(code.co_filename)}:{code.co_name}")] += 1
    return _tracer


def count(lib: Any, n: int) -> dict[str, float]:
    """Bytecodes per round trip in each of the master's threads (fibercore's two queue
    threads are summed per queue under one name)."""
    COUNTS.clear()
    threading.settrace(_tracer)  # before the queues: their threads start traced
    sys.settrace(_tracer)
    inq, outq = lib.Queue(), lib.Queue()
    p = lib.Process(target=T.echo_queue, args=(inq, outq))
    p.start()
    payload = b"x" * 100
    for _ in range(200):
        inq.put(payload)
        outq.get()
    COUNTING[0] = True
    for _ in range(n):
        inq.put(payload)
        outq.get()
    COUNTING[0] = False
    sys.settrace(None)
    threading.settrace(None)
    inq.put(None)
    outq.get()
    p.join(30)
    per: collections.Counter[str] = collections.Counter()
    for (thread, _), v in COUNTS.items():
        per[thread] += v
    return {thread: v / n for thread, v in per.items()}


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    import fibercore

    totals = {}
    for name, lib in (("multiprocessing spawn", multiprocessing.get_context("spawn")), ("fibercore", fibercore)):
        per = count(lib, n)
        totals[name] = sum(per.values())
        print(f"{name}: {totals[name]:.0f} bytecodes per round trip "
              + ", ".join(f"{t} {v:.0f}" for t, v in sorted(per.items(), key=lambda kv: -kv[1]) if v >= 1))
        if name == "fibercore":
            for (thread, fn), v in COUNTS.most_common(int(os.environ.get("TOP", "15"))):
                print(f"    {v / n:7.1f}  {thread:14}  {fn}")
    print(f"fibercore / multiprocessing: {totals['fibercore'] / totals['multiprocessing spawn']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
