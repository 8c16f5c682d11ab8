"""One program's start of stable-baselines3's SubprocVecEnv, in a fresh interpreter (bench_rl's
``sb3start``): ``python _sb3_start.py METHOD N`` prints the seconds from ``SubprocVecEnv(...)``
to its first ``reset()`` returning, with N CartPole envs and start method METHOD ("fiber":
fibercore). The program imports what an SB3 user's does first (SB3, gymnasium), as a user's
script would, so a start method that preloads what the program imported can use it."""

from __future__ import annotations

import sys
import time

import _rl_tasks as T
from stable_baselines3.common.vec_env import SubprocVecEnv

if __name__ == "__main__":
    method, n = sys.argv[1], int(sys.argv[2])
    if method == "fiber":
        import fibercore  # noqa: F401  (registers the "fiber" start method)
    t0 = time.perf_counter()
    vec = SubprocVecEnv([T.make_cartpole] * n, start_method=method)
    vec.reset()
    print(time.perf_counter() - t0)
    vec.close()
