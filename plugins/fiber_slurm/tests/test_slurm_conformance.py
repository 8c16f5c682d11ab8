"""fiber-slurm runs fibercore's backend conformance suite on a real Slurm (slurmctld + slurmd)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

import fibercore as fc
from fibercore.testing import BackendConformance


class TestSlurmBackend(BackendConformance):
    backend = "slurm"
    timeout = 90.0
    logs_from_elsewhere = "running"

    @pytest.fixture
    def backend_config(self, slurm_config: dict[str, Any]) -> dict[str, Any]:
        return dict(slurm_config)

    def kill_outside_fibercore(self, process: fc.Process) -> None:
        """scancel with SIGKILL, as an administrator or a preemption would."""
        subprocess.run(["scancel", "--signal=KILL", "--full", process.job.jid], check=True)
