"""Core test settings: installed third-party plugins stay out of the core's own suite."""

from __future__ import annotations

import os

import pytest

#: Packages the tests install elsewhere (fixtures/fiber_echo has its own tests, run in its venv).
collect_ignore = ["fixtures"]

os.environ.setdefault("FIBER_DISABLE_PLUGIN_AUTOLOAD", "1")
os.environ.pop("FIBER_BACKEND", None)


@pytest.fixture
def fresh_runtime():
    """Re-initialise fibercore after a test that changed config or plugins."""
    import fibercore

    yield
    fibercore.init()

