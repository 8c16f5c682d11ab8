"""fiber-ssh runs fibercore's backend conformance suite on a real OpenSSH server (127.0.0.1)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

import fibercore as fc
from fibercore.testing import BackendConformance


class TestSshBackend(BackendConformance):
    backend = "ssh"
    timeout = 60.0
    jobs_end_with_their_master = True  # its ssh session ends with the master

    @pytest.fixture
    def backend_config(self, ssh_config: dict[str, Any]) -> dict[str, Any]:
        return dict(ssh_config)

    def kill_outside_fibercore(self, process: fc.Process) -> None:
        """SIGKILL to the job's process on its host, as the OOM killer or an operator would."""
        job = process._popen.job.data
        subprocess.run(["kill", "-KILL", str(job.pid)], check=True)  # the host is this machine


class TestSshOnTheCluster(BackendConformance):
    """The same suite with jobs spread over the multi-host test cluster (fiber_docker.cluster:
    each host a container with its own address, network namespace and processes), the
    master on this machine reached through the cluster network's gateway."""

    backend = "ssh"
    timeout = 60.0
    jobs_end_with_their_master = True
    broken_python_exe = "/bin/false"

    @pytest.fixture
    def backend_config(self, ssh_cluster: Any, ssh_keys: dict[str, Any]) -> dict[str, Any]:
        import sshd

        self.cluster = ssh_cluster
        return {"ssh_hostfile": str(ssh_cluster.hostfile), "ssh_identity": str(ssh_keys["key"]),
                "ssh_options": sshd.client_options(ssh_keys["known_hosts"]), "listen_host": ssh_cluster.gateway}

    def kill_outside_fibercore(self, process: fc.Process) -> None:
        """SIGKILL to the job's process on its host (inside that host, not over the network)."""
        job = process._popen.job.data
        host = next(h for h in self.cluster.hosts if h.address == job.host.name)
        self.cluster.exec(host, ["kill", "-KILL", str(job.pid)])
