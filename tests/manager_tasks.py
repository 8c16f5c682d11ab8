"""Module-level targets and shared types for the manager tests."""

from __future__ import annotations

import os
import time
from typing import Any


class Counter:
    def __init__(self, start: int = 0) -> None:
        self.value = start

    def increment(self, by: int = 1) -> int:
        self.value += by
        return self.value

    def get(self) -> int:
        return self.value

    def pid(self) -> int:
        return os.getpid()

    def fail(self, message: str) -> None:
        raise KeyError(message)


class Env:
    """A gym-like environment: ``step`` takes time, like a simulator."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.t = 0

    def reset(self) -> int:
        self.t = 0
        return self.seed

    def step(self, action: int) -> tuple[int, int, int]:
        time.sleep(0.2)
        self.t += 1
        return self.seed, self.t, action

    def explode(self) -> None:
        raise ValueError(f"env {self.seed} exploded")


def use_shared(d: Any, lst: Any, ns: Any, q: Any) -> None:
    d["child"] = os.getpid()
    lst.append("from child")
    ns.answer = 42
    q.put("child done")


def use_remote_manager(address: str, out: Any) -> None:
    from fibercore.managers import SyncManager

    m = SyncManager(address=address)
    m.connect()
    d = m.dict()
    d["made remotely"] = True
    out.put(d)  # a proxy travels back to the master and keeps working there
