"""Workers of bench_paramserver.py (importable by every library's children)."""

from __future__ import annotations

import time

import numpy as np


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def ps_worker(ps, rounds: int, work: float) -> None:
    """fibercore.ParameterServer: pull, then compute and push_pull (one request a round)."""
    params, _ = ps.pull()
    for _ in range(rounds):
        busy(work)
        params, _, _ = ps.push_pull({"w": np.ones_like(params["w"])})


def pipe_worker(conn, rounds: int, work: float) -> None:
    """The hand-written BSP worker: receive the parameters, compute, send the gradient back."""
    for _ in range(rounds):
        w = conn.recv()
        busy(work)
        conn.send(np.ones_like(w))
    conn.close()


def async_worker(conn, rounds: int, work: float) -> None:
    """The hand-written asynchronous worker: send a gradient, receive the parameters it led to."""
    w = conn.recv()
    for _ in range(rounds):
        busy(work)
        conn.send(np.ones_like(w))
        w = conn.recv()
    conn.close()
