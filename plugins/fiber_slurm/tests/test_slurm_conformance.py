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


class TestSlurmOnTheCluster(BackendConformance):
    """The same suite on a multi-node Slurm: slurmctld on this machine, a slurmd on each host
    of the multi-host test cluster (each host a container with its own address, network
    namespace and processes); the jobs' spool is the nodes' shared file system, the master
    listens on the cluster network's gateway."""

    backend = "slurm"
    timeout = 90.0
    logs_from_elsewhere = "running"

    @pytest.fixture
    def backend_config(self, slurm_multinode: Any) -> dict[str, Any]:
        self.slurm = slurm_multinode
        return {"listen_host": slurm_multinode.cluster.gateway, "python_exe": "/opt/fiber/bin/python",
                "slurm_spool_dir": str(slurm_multinode.state.parent / "spool"), "slurm_poll_interval": 0.2,
                "slurm_kill_after": 3.0}

    def kill_outside_fibercore(self, process: fc.Process) -> None:
        """scancel with SIGKILL, as an administrator or a preemption would."""
        subprocess.run(["scancel", "--signal=KILL", "--full", process.job.jid], check=True)

    def test_jobs_run_on_more_than_one_node(self, backend_config: dict[str, Any]) -> None:
        """Twelve one-CPU jobs on 8-CPU nodes: Slurm places them on more than one node."""
        from fibercore.testing.targets import where_am_i

        fc.init(backend="slurm", **backend_config)
        try:
            with fc.Pool(12) as pool:
                assert pool.wait_until_workers_up(180)
                hosts = set(pool.map(where_am_i, [0.5] * 24, chunksize=1))
        finally:
            fc.init()
        assert len(hosts) > 1 and hosts <= {h.name for h in self.slurm.cluster.hosts}, hosts
