"""Locks and shared values between the master and containers, on a real dockerd: the
containers have their own /dev/shm, so every access goes to the master's sync service."""

from __future__ import annotations

from typing import Any

import docker_tasks
import pytest

import fibercore as fc


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_counters_from_8_containers_are_exact(docker_config: dict[str, Any]) -> None:
    """10,000 increments per container under a Lock, and 10,000 through a Value's own lock:
    80,000 each, exactly."""
    fc.init(backend="docker", **docker_config)
    try:
        lock, counter, synced = fc.Lock(), fc.Value("i", 0, lock=False), fc.Value("i", 0)
        out = fc.Queue()
        probe = fc.Process(target=docker_tasks.shm_visible, args=(synced, out))
        probe.start()
        assert out.get(timeout=120) is False  # a container: served, not mapped
        probe.join(60)
        jobs = [fc.Process(target=docker_tasks.count_both, args=(lock, counter, synced, 10_000)) for _ in range(8)]
        for p in jobs:
            p.start()
        for p in jobs:
            p.join(540)
        assert [p.exitcode for p in jobs] == [0] * 8
        assert counter.value == 80_000 and synced.value == 80_000
    finally:
        fc.init()
