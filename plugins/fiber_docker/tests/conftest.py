"""Fixtures for the docker backend's tests: a real dockerd, a real image, no leftovers.

- ``docker_image``: the worker image, built once per change of the code (content
  tag) from a local Debian base (``image/base.sh``; there is no registry here) with
  ``python -m fiber_docker.image --source <checkout>``, i.e. the user's own recipe.
  ``FIBER_DOCKER_TEST_IMAGE`` names a ready image instead.
- Without a reachable dockerd the tests skip with the reason, except under
  ``CI=true``, where that is a failure (a skipped docker suite proves nothing).
- Every container of this test run carries the label ``fiber-test-run=<id>``; at the
  end of the session none may remain.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from docker_helpers import CHECKOUT, RUN_LABEL
from fiber_docker.testing import docker_problem, skip_or_fail, test_image


@pytest.fixture(scope="session")
def docker_client() -> Any:
    problem = docker_problem()
    if problem is not None:
        skip_or_fail(problem, "docker")
    import docker

    return docker.from_env()


@pytest.fixture(scope="session")
def docker_image(docker_client: Any) -> Iterator[str]:
    image = test_image(CHECKOUT)
    yield image
    leftovers = _wait_for_no_containers(docker_client, {"label": RUN_LABEL}, 20.0)
    for c in leftovers:
        docker_client.api.remove_container(c["Id"], force=True)
    assert not leftovers, f"containers of this test run left behind: {_names(leftovers)}"


def _names(containers: list[dict[str, Any]]) -> list[str]:
    return [name.lstrip("/") for c in containers for name in c.get("Names", [])]


def _wait_for_no_containers(client: Any, filters: dict[str, str], timeout: float) -> list[dict[str, Any]]:
    """Containers matching ``filters`` still there after up to ``timeout`` s (auto-removal
    follows an exit by a few milliseconds)."""
    deadline = time.monotonic() + timeout
    while True:
        found = client.api.containers(all=True, filters=filters)  # no per-container inspect: no race
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


@pytest.fixture
def docker_config(docker_image: str) -> dict[str, Any]:
    """The config the docker tests run with (labels mark this test run's containers)."""
    return {"image": docker_image, "docker_labels": RUN_LABEL, "docker_echo_output": False}


@pytest.fixture
def no_containers_left(docker_client: Any) -> Any:
    """Call with a session id: waits until no container of it exists, else fails."""

    def check(session: str, timeout: float = 20.0) -> None:
        left = _wait_for_no_containers(docker_client, {"label": f"fiber-session={session}"}, timeout)
        assert not left, f"containers of session {session} still exist: {_names(left)}"

    return check
