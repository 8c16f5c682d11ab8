"""Worker functions the parameter-server tests run in jobs (importable there)."""

from __future__ import annotations

import os
import time

import numpy as np


def rounds(ps, wid: int, n: int, delay: float = 0.0, log=None) -> list[tuple[int, int]]:
    """``n`` rounds: pull, wait ``delay``, push ``wid + 1`` everywhere; (round, version) pulled."""
    seen = []
    for r in range(n):
        params, version = ps.pull(timeout=60)
        seen.append((r, version))
        if log is not None:
            log.put((wid, r, version, float(params["w"][0])))
        time.sleep(delay)
        ps.push({"w": np.full(4, wid + 1.0)})
    return seen


def one_hot_pushes(ps, wid: int, n: int, width: int) -> int:
    """Push ``n`` gradients, each 1 at its own position (wid * n + k): applied once each, the
    parameters end at -1 there (lr=1)."""
    for k in range(n):
        ps.pull(timeout=60)
        g = np.zeros(width)
        g[wid * n + k] = 1.0
        ps.push({"w": g})
    return n


def straggle(ps, wid: int, n: int, slow_round: int, pause: float) -> list[bool]:
    """Rounds in which round ``slow_round`` takes ``pause`` s: what each push returned."""
    taken = []
    for r in range(n):
        ps.pull(timeout=60)
        if r == slow_round:
            time.sleep(pause)
        taken.append(ps.push({"w": np.full(4, 1.0)}))
    return taken


def pid_then_rounds(ps, q, wid: int, n: int, delay: float) -> None:
    q.put(os.getpid())
    rounds(ps, wid, n, delay)


def task_rounds(ps, wid: int, n: int, delay: float = 0.0) -> list[tuple[int, int]]:
    """A Pool task: ``n`` rounds as a member, leaving at the end (its worker goes on)."""
    with ps.worker():
        return rounds(ps, wid, n, delay)


def task_rounds_die_once(ps, wid: int, n: int, marker: str) -> list[tuple[int, int]]:
    """As task_rounds; worker 0 SIGKILLs itself in round 3 the first time (the Pool reruns it)."""
    import signal
    from pathlib import Path

    with ps.worker():
        seen = []
        for r in range(n):
            params, version = ps.pull(timeout=60)
            seen.append((r, version))
            if wid == 0 and r == 3 and not Path(marker).exists():
                Path(marker).write_text("died")
                os.kill(os.getpid(), signal.SIGKILL)
            ps.push({"w": np.full(4, wid + 1.0)})
        return seen


def rounds_push_pull(ps, wid: int, n: int, log) -> None:
    """As rounds(), in one request per round after the first pull."""
    params, version = ps.pull(timeout=60)
    for r in range(n):
        log.put((wid, r, version, float(params["w"][0])))
        params, version, accepted = ps.push_pull({"w": np.full(4, wid + 1.0)}, timeout=60)
        assert accepted


def rounds_elsewhere(ps, machine: str, wid: int, n: int, log=None) -> list[tuple[int, int]]:
    """As rounds(), as if this job ran on machine ``machine`` (another machine to the server:
    pulls come through the relay on this machine's /dev/shm, shared by every job "there")."""
    import fibercore.paramserver as paramserver

    paramserver.here = lambda: machine
    return rounds(ps, wid, n, 0.0, log)


def hold_relay_board(ps, machine: str, ready, hold) -> None:
    """Pull once "from another machine" (making this machine's relay board), report its name,
    keep it until ``hold`` is set."""
    import fibercore.paramserver as paramserver
    from fibercore.paramserver import relay

    paramserver.here = lambda: machine
    ps.pull(timeout=60)
    ready.put(next(name for name, board in relay._boards.items() if board is not None))
    hold.wait(120)
    ps.leave()
