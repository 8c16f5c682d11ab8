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


def echo_bytes_until_empty(conn: Any) -> None:
    """Echo each message until an empty one (bench_rl.py's paired blocks: open-ended)."""
    while True:
        data = conn.recv_bytes()
        if not data:
            return
        conn.send_bytes(data)


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


def put_when_told(q: Any, ready: Any, go: Any, n: int, size: int) -> None:
    """Say ready, wait for the start, then put ``n`` items of ``size`` bytes."""
    payload = b"x" * size
    ready.put(1)
    go.wait()
    for _ in range(n):
        q.put(payload)


def get_n(q: Any, done: Any, n: int) -> None:
    """Take ``n`` items, then say when the last one came."""
    for _ in range(n):
        q.get()
    done.put(time.perf_counter())


def send_when_told(conn: Any, go: Any, n: int, size: int) -> None:
    """Wait for the start, then send ``n`` messages of ``size`` bytes on the Pipe."""
    payload = b"x" * size
    go.wait()
    for _ in range(n):
        conn.send_bytes(payload)
    conn.recv_bytes()  # the master has read everything


def make_cartpole() -> Any:
    """An env factory for stable-baselines3's SubprocVecEnv (pickled by reference)."""
    import gymnasium as gym

    return gym.make("CartPole-v1")


def sphere_costly(x: Any) -> float:
    """A Nevergrad objective that computes for 5 ms (bench_rl's ``ng``)."""
    import numpy as np

    end = time.perf_counter() + 0.005
    while time.perf_counter() < end:
        pass
    return float(np.sum((np.asarray(x) - 0.5) ** 2))
