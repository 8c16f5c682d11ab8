"""Helpers for test suites that need a real dockerd and a worker image (the docker
backend's own tests, and backends that run their jobs as containers: Batch on moto,
Kubernetes with dockershim).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_or_fail(problem: str, suite: str) -> None:
    """Skip the test with the reason, or fail it under ``CI=true`` (a skipped suite proves nothing)."""
    import pytest

    if in_ci():
        pytest.fail(f"CI=true but the {suite} tests cannot run: {problem}", pytrace=False)
    pytest.skip(problem)


def docker_problem() -> str | None:
    """Why no Docker daemon can be used here, or None when one answers."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install -e plugins/fiber_docker)"
    try:
        docker.from_env().ping()
    except Exception as exc:
        return f"no Docker daemon answers ({exc}); scripts/test starts one when run as root on Debian"
    return None


def test_image(checkout: str | Path) -> str:
    """The worker image of this checkout's code: ``FIBER_DOCKER_TEST_IMAGE`` if set,
    else built (or reused, by content) on a local Debian base from
    ``plugins/fiber_docker/tests/image/base.sh`` (``FIBER_DOCKER_TEST_BASE`` overrides)."""
    from fiber_docker.image import build_image

    image = os.environ.get("FIBER_DOCKER_TEST_IMAGE")
    if image:
        return image
    checkout = Path(checkout)
    base = os.environ.get("FIBER_DOCKER_TEST_BASE")
    if not base:
        script = checkout / "plugins" / "fiber_docker" / "tests" / "image" / "base.sh"
        done = subprocess.run([str(script)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building the test base image failed:\n{done.stderr[-3000:]}")
        base = done.stdout.strip().splitlines()[-1]
    return build_image(base=base, source=checkout, content_tag="fibercore-test/worker", log=lambda text: None)


test_image.__test__ = False  # type: ignore[attr-defined]  # not a pytest test
