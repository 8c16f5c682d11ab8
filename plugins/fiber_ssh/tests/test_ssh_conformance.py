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
