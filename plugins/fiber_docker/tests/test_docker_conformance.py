"""fiber-docker runs fibercore's backend conformance suite against a real dockerd."""

import subprocess
from typing import Any

import pytest
from docker_helpers import docker_cli

import fibercore as fc
from fibercore.testing import BackendConformance


class TestDockerBackend(BackendConformance):
    backend = "docker"
    terminate_exitcode = -15  # SIGTERM forwarded by the container's init, as multiprocessing reports it
    broken_python_exe = "/bin/false"  # exists in the image, is no Python
    kill_pool_size = 8

    @pytest.fixture
    def backend_config(self, docker_config: dict[str, Any], docker_client: Any) -> dict[str, Any]:
        self.docker = docker_client
        return dict(docker_config, docker_nested=True)  # the suite starts jobs from jobs: trusted code

    def kill_outside_fibercore(self, process: fc.Process) -> None:
        """`docker kill` from the command line."""
        cid = process.job.data.cid
        assert self.docker.containers.get(cid).status == "running"
        killed = subprocess.run([*docker_cli(), "kill", cid], capture_output=True, text=True)
        assert killed.returncode == 0, killed.stderr

    def check_replaced_outside(self, victim: fc.Process, workers: list[fc.Process]) -> None:
        assert victim.exitcode == -9  # docker kill: SIGKILL, as multiprocessing reports it
        session = fc.get_runtime().session
        running = {c["Id"] for c in self.docker.api.containers(filters={"label": f"fiber-session={session}"})}
        assert {w.job.data.cid for w in workers} <= running
