"""fiber-docker runs fibercore's backend conformance suite against a real dockerd."""

from typing import Any

import pytest

from fibercore.testing import BackendConformance


class TestDockerBackend(BackendConformance):
    backend = "docker"
    terminate_exitcode = -15  # SIGTERM forwarded by the container's init, as multiprocessing reports it
    broken_python_exe = "/bin/false"  # exists in the image, is no Python

    @pytest.fixture
    def backend_config(self, docker_config: dict[str, Any]) -> dict[str, Any]:
        return dict(docker_config)
