"""Worker side of bench_es_scale.py (importable by reference in every library's workers).

An ES worker, as in the paper's experiment: it holds the noise table it was given once, and
evaluates antithetic pairs of perturbations of the policy ``theta``; an evaluation costs a
fixed amount of CPU (a stand-in for an episode of a simulator).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

_table: Any = None
_eval_seconds = 0.001


def init_worker(table: Any, eval_seconds: float) -> None:
    """Keep the noise table (a numpy array; a fibercore.Shared handle is opened here)."""
    global _table, _eval_seconds
    _table = table.value if hasattr(table, "value") else table
    _eval_seconds = eval_seconds


def _episode(params: np.ndarray) -> float:
    """The fitness of ``params`` after ``_eval_seconds`` of this process's CPU."""
    end = time.process_time() + _eval_seconds
    fitness = -float(np.dot(params - 0.5, params - 0.5))
    while time.process_time() < end:
        pass
    return fitness


def evaluate(task: tuple[np.ndarray, int, float]) -> tuple[float, float]:
    """Fitness of theta + sigma * eps and theta - sigma * eps, eps read from the table at ``offset``."""
    theta, offset, sigma = task
    eps = _table[offset:offset + theta.size]
    return _episode(theta + sigma * eps), _episode(theta - sigma * eps)


def hello(seconds: float) -> int:
    """Wait ``seconds`` and say who ran this (one per worker when all are up)."""
    time.sleep(seconds)
    return os.getpid()
