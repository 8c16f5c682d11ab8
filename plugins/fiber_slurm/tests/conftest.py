"""A real Slurm for the tests (slurm_cluster.py): brought up once per session, stopped by PID."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slurm_cluster

from fibercore.testing import skip_or_fail


@pytest.fixture(scope="session")
def slurm_conf(tmp_path_factory: Any) -> Iterator[Path]:
    why = slurm_cluster.problem()
    if why:
        skip_or_fail(why, "slurm")
    state = Path(tmp_path_factory.mktemp("slurm"))
    conf = slurm_cluster.up(state)
    try:
        with slurm_cluster.conf_in_env(conf):
            yield conf
    finally:
        slurm_cluster.down(state)


@pytest.fixture
def slurm_config(slurm_conf: Path) -> dict[str, Any]:
    return {"listen_host": "127.0.0.1", "slurm_spool_dir": str(slurm_conf.parent / "fiber"),
            "slurm_poll_interval": 0.2, "slurm_kill_after": 3.0}


CHECKOUT = Path(__file__).resolve().parents[3]
#: Nodes of the multi-node Slurm (FIBER_TEST_CLUSTER_HOSTS asks for more).
CLUSTER_HOSTS = int(os.environ.get("FIBER_TEST_CLUSTER_HOSTS") or 4)


@pytest.fixture(scope="session")
def slurm_multinode(tmp_path_factory: Any) -> Iterator[slurm_cluster.MultiNode]:
    """A multi-node Slurm: slurmctld here, one slurmd on each host of the multi-host test
    cluster (fiber_docker.cluster), the checkout and the jobs' spool shared with every node."""
    from fiber_docker.cluster import cluster_problem
    from fiber_docker.testing import docker_problem, test_image

    why = slurm_cluster.problem() or docker_problem() or cluster_problem()
    if why:
        skip_or_fail(why, "multi-node slurm")
    import docker

    client = docker.from_env()
    root = Path(tmp_path_factory.mktemp("slurm-multinode"))
    slurm = slurm_cluster.MultiNode(root / "state", client, test_image(CHECKOUT), CLUSTER_HOSTS, root / "spool",
                                    mounts=(str(CHECKOUT),))
    try:
        with slurm_cluster.conf_in_env(slurm.conf):
            yield slurm
    finally:
        slurm.down()
