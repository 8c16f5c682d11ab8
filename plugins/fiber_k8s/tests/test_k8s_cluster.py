"""End to end on the real cluster (a Pool surviving a pod deletion is in the conformance
suite, test_k8s_conformance.py): ownerReferences let the garbage collector delete the jobs
with their master's pod; the Secret; pods that can never start; detection inside a pod;
nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import fibercore as fc
from fibercore.testing.targets import sleep_for


@pytest.fixture
def k8s(k8s_config: dict[str, Any], fiber_backend_init: Any) -> Any:
    return lambda **extra: fiber_backend_init(backend="kubernetes", **{**k8s_config, **extra})


def _gone(core: Any, selector: str, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        names = [p.metadata.name for p in core.list_namespaced_pod("default", label_selector=selector).items]
        if not names or time.monotonic() > deadline:
            return names
        time.sleep(0.3)


def test_pods_carry_labels_secret_and_owner(k8s: Any, core: Any, worker_image: str) -> None:
    """ownerReferences to the master's pod: the cluster's garbage collector deletes the
    jobs (and the Secret's owner is that pod too) when the master's pod goes."""
    owner = core.create_namespaced_pod("default", {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"fiber-test-master-{os.getpid()}", "labels": {"fiber-test": "owner"}},
        "spec": {"hostNetwork": True, "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "m", "image": worker_image, "imagePullPolicy": "Never",
                                 "command": ["python", "-c", "import time; time.sleep(600)"]}]}})
    try:
        k8s(k8s_owner_pod=owner.metadata.name)
        p = fc.Process(target=sleep_for, args=(300,), name="owned")
        p.start()
        pod = core.read_namespaced_pod(p.job.jid, "default")
        rt = fc.get_runtime()
        assert pod.metadata.labels["fiber-session"] == rt.session
        assert pod.metadata.labels["fiber-process"] == "owned"
        assert [(o.kind, o.name, o.uid) for o in pod.metadata.owner_references] == [
            ("Pod", owner.metadata.name, owner.metadata.uid)]
        env = {e.name: e for e in pod.spec.containers[0].env}
        assert env["FIBER_SECRET"].value is None
        assert env["FIBER_SECRET"].value_from.secret_key_ref.name == f"fiber-{rt.session}"
        secret = core.read_namespaced_secret(f"fiber-{rt.session}", "default")
        assert secret.metadata.labels["fiber-session"] == rt.session
        core.delete_namespaced_pod(owner.metadata.name, "default", grace_period_seconds=0)
        p.join(120)  # the garbage collector deleted the job's pod
        assert p.exitcode == -9
        with pytest.raises(Exception) as info:
            core.read_namespaced_pod(p.job.jid, "default")
        assert getattr(info.value, "status", None) == 404
    finally:
        try:
            core.delete_namespaced_pod(owner.metadata.name, "default", grace_period_seconds=0)
        except Exception:
            pass
        fc.get_runtime().plugins.cleanup_jobs(fc.get_runtime().session)


def test_a_pod_that_cannot_start_fails_at_once_with_the_reason(k8s: Any) -> None:
    k8s(image="fibercore-test/no-such-image:0")
    t0 = time.monotonic()
    with pytest.raises(fc.ProcessError) as info:
        fc.Process(target=sleep_for, args=(0,)).start()
    assert time.monotonic() - t0 < 60  # not start_timeout (300 s)
    assert "ErrImageNeverPull" in str(info.value)


def test_terminate_and_logs(k8s: Any) -> None:
    from fibercore.testing.targets import print_marker

    k8s()
    p = fc.Process(target=print_marker, args=("k8s-log-marker",))
    p.start()
    p.join(90)
    assert p.exitcode == 0 and "k8s-log-marker-stderr" in p.logs()
    q = fc.Process(target=sleep_for, args=(300,))
    q.start()
    q.terminate()
    q.terminate()
    q.join(90)
    assert q.exitcode == -15


def test_detected_inside_a_pod(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import fiber_k8s.engine
    from fiber_k8s.plugin import plugin

    fiber_detect_backend = plugin.fiber_detect_backend
    assert fiber_detect_backend() is None or os.environ.get("KUBERNETES_SERVICE_HOST")
    (tmp_path / "token").write_text("t")
    monkeypatch.setattr(fiber_k8s.engine, "SA_DIR", str(tmp_path))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    assert fiber_detect_backend() == "kubernetes"


MASTER = textwrap.dedent("""
    import sys
    import fibercore as fc
    from fibercore.testing.targets import triple

    fc.init(backend="kubernetes", **dict(arg.split("=", 1) for arg in sys.argv[1:]))
    with fc.Pool(2) as pool:
        assert pool.map(triple, range(20)) == [3 * x for x in range(20)]
    print(fc.get_runtime().session, flush=True)
""")


def test_no_pod_or_secret_of_a_finished_session_remains(k8s_config: dict[str, Any], core: Any,
                                                         tmp_path: Any) -> None:
    script = tmp_path / "master.py"
    script.write_text(MASTER)
    args = [f"{k}={'true' if v is True else v}" for k, v in k8s_config.items()]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    session = done.stdout.strip().splitlines()[-1]
    assert _gone(core, f"fiber-session={session}") == []
    assert core.list_namespaced_secret("default", label_selector=f"fiber-session={session}").items == []
