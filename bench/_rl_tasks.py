"""Functions for bench_rl.py's processes and pools, importable by reference in every
library's children (multiprocessing's spawn and forkserver re-import this module)."""

from __future__ import annotations

import time
from typing import Any


def env_worker(conn: Any, env_id: str) -> None:
    """One simulator stepped over a Pipe, as PPO's vectorised environments do: receive an
    action, step, send (obs, reward, terminated, truncated); None ends it."""
    import gymnasium as gym

    env = gym.make(env_id)
    env.reset(seed=0)
    while True:
        action = conn.recv()
        if action is None:
            break
        obs, reward, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
        conn.send((obs, reward, terminated, truncated))
    conn.close()


def echo_bytes(conn: Any, n: int) -> None:
    for _ in range(n):
        conn.send_bytes(conn.recv_bytes())


def echo_queue(inq: Any, outq: Any) -> None:
    while True:
        item = inq.get()
        outq.put(item)
        if item is None:
            return


def first_message(q: Any, t0: float) -> None:
    q.put(time.perf_counter() - t0)


def small_numpy(args: tuple[Any, int]) -> float:
    """A small numpy task: the kind of many-tiny-tasks map an ES or a data pipeline sends."""
    array, k = args
    return float(array.sum()) * k


def busy(ms: float) -> int:
    """Burn ``ms`` milliseconds of CPU (a task that computes, not one that sleeps)."""
    end = time.perf_counter() + ms / 1000.0
    n = 0
    while time.perf_counter() < end:
        n += 1
    return n


def noop(x: Any) -> Any:
    return x


def nothing() -> None:
    return None
