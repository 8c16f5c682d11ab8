"""Instructions a Pipe round trip executes, fibercore against multiprocessing: a count that
does not move with the machine's load (timings on a shared VM move 30% between runs).

Both ends live in one process, so one ``valgrind --tool=callgrind`` run counts both sides'
user-space instructions: for fibercore a connected pair over the transport (the end that
dials is a copy made by pickling, as a child's would be), for multiprocessing a Pipe.
Each variant runs twice, with 0 and with N round trips; the difference over N is the cost
of one. Three messages: 100 raw bytes (``send_bytes``), a CartPole step's
``(observation, reward, terminated, truncated)`` (``send``), and gymnasium's and SB3's
exchange (``("step", np.int64)`` answered by ``((observation, ...,  {}), True)``).

    python bench/pipe_instructions.py [N]      # needs valgrind; about a minute

Not counted: the kernel, waiting, and what memory costs (a forked child shares its parent's
pages): ``bench/pipe_floor.py`` times those.
"""

from __future__ import annotations

import os
import pickle
import re
import shutil
import subprocess
import sys
from typing import Any


def round_trips(lib: str, message: str, n: int) -> None:
    """``n`` round trips after a warm-up, in this process."""
    import multiprocessing

    import numpy as np

    import fibercore

    a: Any
    b: Any
    if lib == "fibercore":
        a, home_b = fibercore.Pipe()
        b = pickle.loads(pickle.dumps(home_b))  # a dialling copy, as a child's end is
        home_b.close()
        b.send("hi")
        assert a.recv() == "hi"
    else:
        a, b = multiprocessing.Pipe()
    if message == "bytes":
        raw = bytes(100)
        for _ in range(200 + n):
            a.send_bytes(raw)
            b.send_bytes(b.recv_bytes())
            a.recv_bytes()
    elif message == "step":
        step = (np.zeros(4, dtype=np.float32), 1.0, False, False)
        for _ in range(200 + n):
            a.send(1)
            b.recv()
            b.send(step)
            a.recv()
    else:  # gymnasium's AsyncVectorEnv and SB3's SubprocVecEnv: numpy action, info dict
        action = np.zeros(1, dtype=np.int64)[0]
        answer = ((np.zeros(4, dtype=np.float32), 1.0, False, False, {}), True)
        for _ in range(200 + n):
            a.send(("step", action))
            b.recv()
            b.send(answer)
            a.recv()


def count(lib: str, message: str, n: int) -> int:
    """Instructions callgrind counted for a run of ``n`` round trips."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")  # idle BLAS threads spin under valgrind
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, __file__, "--run", lib, message, str(n)],
                         capture_output=True, text=True, env=env, check=True).stderr
    found = re.search(r"Collected : (\d+)", out)
    if found is None:
        raise SystemExit(f"callgrind printed no count:\n{out[-2000:]}")
    return int(found.group(1))


def main() -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    for message in ("bytes", "step", "gym"):
        per = {lib: (count(lib, message, n) - count(lib, message, 0)) / n
               for lib in ("fibercore", "multiprocessing")}
        print(f"{message:5} round trip: fibercore {per['fibercore']:8.0f}  multiprocessing "
              f"{per['multiprocessing']:8.0f} instructions  ({per['fibercore'] / per['multiprocessing']:.2f}x)",
              flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 4 and sys.argv[1] == "--run":
        round_trips(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        main()
