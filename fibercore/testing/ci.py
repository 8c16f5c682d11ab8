"""Skip or fail: a backend's suite that cannot run here skips with the reason, except under
``CI=true``, where a skipped suite proves nothing and so fails."""

from __future__ import annotations

import os


def in_ci() -> bool:
    """Whether ``CI`` is set to a true value (``1``, ``true``, ``yes``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_or_fail(problem: str, suite: str) -> None:
    """Skip the test with the reason, or fail it under ``CI=true``."""
    import pytest

    if in_ci():
        pytest.fail(f"CI=true but the {suite} tests cannot run: {problem}", pytrace=False)
    pytest.skip(problem)
