"""pytest plugin (entry point ``pytest11``): fixtures for testing fibercore backends.

``fiber_backend_init`` initialises fibercore for a backend; afterwards it stops the
jobs a test left running and restores the default configuration, so tests of several
backends can share one session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


def stop_children(timeout: float = 30.0) -> None:
    """Kill and join the jobs this process still has (what a test left running)."""
    import fibercore

    for p in fibercore.active_children():
        p.kill()
        p.join(timeout)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "fiber_lifecycle: the conformance suite's lifecycle tests (exit codes, join, "
        "terminate, kill, logs)")


@pytest.fixture
def fiber_backend_init() -> Iterator[Callable[..., Any]]:
    import fibercore

    def _init(**kw: Any) -> Any:
        return fibercore.init(**kw)

    yield _init
    stop_children()
    fibercore.init()
