"""Fixtures for the Kubernetes backend's tests: a real single-node cluster on this machine.

- ``kubeconfig``: ``FIBER_K8S_KUBECONFIG`` if set (a cluster you bring), else the cluster
  of ``cluster/up.sh`` (Kubernetes 1.20 built from Debian's source by
  ``cluster/build.sh``, etcd from Debian, a kubelet driving the local dockerd), brought up
  once for the session and stopped by the PIDs it recorded.
- ``k8s_config``: fibercore config for it: the checkout's worker image (as for the docker
  tests), host networking (there is no CNI here), everything on 127.0.0.1.
- At the end of the session no pod or Secret of this test run may remain.

Without the binaries or root the tests skip with the reason, except under ``CI=true``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fiber_docker.testing import docker_problem, skip_or_fail, test_image
from k8s_helpers import CHECKOUT, RUN_LABEL, cluster_problem, down, up


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory: Any) -> Iterator[Path]:
    import os

    given = os.environ.get("FIBER_K8S_KUBECONFIG")
    if given:
        yield Path(given)
        return
    problem = cluster_problem() or docker_problem()
    if problem:
        skip_or_fail(problem, "k8s")
    state = tmp_path_factory.mktemp("k8s")
    try:
        path = up(state)
    except Exception:
        down(state)
        raise
    try:
        yield path
    finally:
        down(state)


@pytest.fixture(scope="session")
def core(kubeconfig: Path) -> Iterator[Any]:
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    yield api
    from fiber_k8s.plugin import plugin

    plugin.close()  # what the master does at exit: its Secrets go
    selector = RUN_LABEL
    deadline = time.monotonic() + 30
    while True:
        pods = api.list_namespaced_pod("default", label_selector=selector).items
        secrets = api.list_namespaced_secret("default", label_selector="app.kubernetes.io/managed-by=fibercore").items
        if (not pods and not secrets) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert not pods, f"pods of this test run left behind: {[p.metadata.name for p in pods]}"
    assert not secrets, f"fibercore Secrets left behind: {[s.metadata.name for s in secrets]}"


@pytest.fixture(scope="session")
def worker_image(kubeconfig: Path) -> str:
    return test_image(CHECKOUT)


@pytest.fixture
def k8s_config(kubeconfig: Path, worker_image: str, core: Any) -> dict[str, Any]:
    state = str(kubeconfig.parent)
    return {
        "image": worker_image,
        "k8s_kubeconfig": str(kubeconfig),
        "k8s_namespace": "default",
        "k8s_host_network": True,  # no CNI on the test node
        "k8s_image_pull_policy": "Never",  # no registry: the image is on the node's dockerd
        "k8s_labels": RUN_LABEL,
        # jobs that start jobs read the kubeconfig (and its CA) from the node
        "k8s_volumes": f"hostpath:{state}:{state}:ro",
        "listen_host": "127.0.0.1",
        "k8s_job_listen_host": "127.0.0.1",
    }
