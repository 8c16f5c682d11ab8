"""pytest plugin (entry point ``pytest11``): fixtures for testing fibercore backends.

``fiber_backend_init`` initialises fibercore for a backend and restores the previous
configuration afterwards, so tests of several backends can share one session.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest


@pytest.fixture
def fiber_backend_init() -> Iterator[Callable[..., Any]]:
    import fibercore

    def _init(**kw: Any) -> Any:
        return fibercore.init(**kw)

    yield _init
    fibercore.init()
