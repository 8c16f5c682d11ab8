"""Real sshd servers for the ssh backend's tests (sshd.py), keys made per test session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd
from fiber_docker.testing import docker_problem, test_image

from fibercore.testing import skip_or_fail

CHECKOUT = Path(__file__).resolve().parents[3]
#: Hosts of the test cluster (FIBER_TEST_CLUSTER_HOSTS asks for more).
CLUSTER_HOSTS = int(os.environ.get("FIBER_TEST_CLUSTER_HOSTS") or 4)


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: Any) -> dict[str, Any]:
    why = sshd.problem()
    if why:
        skip_or_fail(why, "ssh")
    state = Path(tmp_path_factory.mktemp("ssh-client"))
    state.chmod(0o700)
    public = sshd.keygen(state / "id_ed25519")
    return {"dir": state, "key": state / "id_ed25519", "public": public, "known_hosts": state / "known_hosts"}


@pytest.fixture(scope="session")
def local_sshd(ssh_keys: dict[str, Any], tmp_path_factory: Any) -> Iterator[sshd.Sshd]:
    server = sshd.Sshd(Path(tmp_path_factory.mktemp("sshd")), ssh_keys["public"])
    with open(ssh_keys["known_hosts"], "a") as fh:
        fh.write(server.known_hosts_line() + "\n")
    yield server
    server.stop()


@pytest.fixture
def ssh_config(local_sshd: sshd.Sshd, ssh_keys: dict[str, Any]) -> dict[str, Any]:
    return {"ssh_hosts": "127.0.0.1:8", "ssh_port": local_sshd.port, "ssh_identity": str(ssh_keys["key"]),
            "ssh_options": sshd.client_options(ssh_keys["known_hosts"])}


@pytest.fixture(scope="session")
def ssh_cluster(ssh_keys: dict[str, Any], tmp_path_factory: Any) -> Iterator[Any]:
    """The multi-host test cluster (fiber_docker.cluster; 4 hosts, FIBER_TEST_CLUSTER_HOSTS=N
    for more), each host running sshd with its own host key (in known_hosts) that lets the
    session's client key in."""
    from fiber_docker.cluster import cluster_problem

    problem = docker_problem() or cluster_problem()
    if problem is not None:
        skip_or_fail(problem, "cluster")
    import docker

    client = docker.from_env()
    cluster = sshd.start_cluster(client, test_image(CHECKOUT), CLUSTER_HOSTS, ssh_keys["dir"], ssh_keys["public"],
                                 ssh_keys["known_hosts"])
    try:
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def on_cluster(ssh_cluster: Any, ssh_keys: dict[str, Any]) -> Iterator[Any]:
    """fibercore on the cluster (fiber-ssh, a hostfile of its hosts, the liveness bound of
    cluster_helpers); afterwards no fault and no job is left on any host."""
    from cluster_helpers import BEAT, BOUND, wait_for, worker_pids

    import fibercore as fc

    fc.init(backend="ssh", ssh_hostfile=str(ssh_cluster.hostfile), ssh_identity=str(ssh_keys["key"]),
            ssh_options=sshd.client_options(ssh_keys["known_hosts"]), ssh_host_retry=2, ssh_connect_timeout=3,
            heartbeat_interval=BEAT, heartbeat_timeout=BOUND,
            listen_host=ssh_cluster.gateway)  # this machine's address on the cluster's network
    yield ssh_cluster
    for host in ssh_cluster.hosts:  # every test leaves a clean cluster: no fault first (a kill reaches)...
        ssh_cluster.heal(host)
    for p in fc.active_children():
        p.kill()
        p.join(30)
    fc.init()
    for host in ssh_cluster.hosts:  # ... then no job
        wait_for(lambda h=host: not worker_pids(ssh_cluster, h), 60, f"jobs left on {host.name}")
