"""fiber-k8s runs fibercore's backend conformance suite on a real single-node cluster."""

import time
from typing import Any

import pytest

import fibercore as fc
from fibercore.testing import BackendConformance


class TestKubernetesBackend(BackendConformance):
    backend = "kubernetes"
    terminate_exitcode = -15  # pod deleted by terminate(): reported as SIGTERM, as multiprocessing does
    broken_python_exe = "/bin/false"  # exists in the image, is no Python
    timeout = 90.0
    kill_task_seconds = 0.08  # the kill first waits for the kubelet to report the pod Running

    @pytest.fixture
    def backend_config(self, k8s_config: dict[str, Any], core: Any) -> dict[str, Any]:
        self.core = core
        return dict(k8s_config)

    def kill_outside_fibercore(self, process: fc.Process) -> None:
        """Delete the pod through the API (an eviction, a drained node, kubectl delete)."""
        name = process.job.jid
        deadline = time.monotonic() + self.timeout
        while self.core.read_namespaced_pod(name, "default").status.phase != "Running":  # the kubelet reports late
            assert time.monotonic() < deadline
            time.sleep(0.1)
        self.core.delete_namespaced_pod(name, "default", grace_period_seconds=0)

    def check_replaced_outside(self, victim: fc.Process, workers: list[fc.Process]) -> None:
        """The cluster shows the workers' pods Running (the kubelet reports a pod's phase
        seconds after its container runs) and the victim's pod gone."""
        session = fc.get_runtime().session
        wanted = {w.job.jid for w in workers}
        deadline = time.monotonic() + self.timeout
        while True:
            running = {p.metadata.name for p in self.core.list_namespaced_pod(
                "default", label_selector=f"fiber-session={session}").items if p.status.phase == "Running"}
            if (wanted <= running and victim.job.jid not in running) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert wanted <= running and victim.job.jid not in running
