"""``fiber run`` on the real test cluster: the image is built, pushed to a real registry
(Debian's docker-registry on 127.0.0.1) and pulled from it by the kubelet (imagePullPolicy
Always); the master runs as a pod, its output is followed, its exit code returned."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from fiber_docker.testing import registry_fixture

from fibercore.testing import fiber, interrupt_when, session_of, write_demo_project

registry = registry_fixture()  # Debian's docker-registry on 127.0.0.1


@pytest.fixture
def env(k8s_config: dict[str, Any]) -> dict[str, str]:
    """The test cluster's config as FIBER_* variables, as a user's shell would hold it."""
    values = {k: v for k, v in k8s_config.items() if k != "k8s_image_pull_policy"}  # fiber run's Always
    return {"FIBER_BACKEND": "kubernetes",
            **{f"FIBER_{k.upper()}": (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in values.items()}}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_demo_project(tmp_path / "demo")



def pods_of(core: Any, session: str) -> list[str]:
    pods = core.list_namespaced_pod("default", label_selector=f"fiber-session={session}").items
    return [p.metadata.name for p in pods]


def wait_no_pods(core: Any, session: str, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := pods_of(core, session)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_run_build_push_pulls_from_the_registry_and_returns_the_exit_code(project, registry, env, core):
    done = fiber("run", "--build", str(project), "--push", registry.address, "--", "python", "app.py", cwd=project,
                 env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "squares [0, 1, 4, 9, 16, 25] six 1.16.0" in done.stdout  # followed from the master pod's log
    assert re.search(r"master job fiber-[0-9a-f]+-master-\w+ on kubernetes", done.stderr)
    assert registry.pulls("demo") >= 3, "the master and both workers pull the image from the registry"
    assert wait_no_pods(core, session_of(done.stderr)) == []
    failing = fiber("run", "--build", str(project), "--push", registry.address, "--", "python", "app.py", "3",
                    cwd=project, env=env)
    assert failing.returncode == 3 and "squares" in failing.stdout, failing.stderr
    assert wait_no_pods(core, session_of(failing.stderr)) == []


def test_ctrl_c_leaves_no_pod(project, registry, env, core):
    code, out, err = interrupt_when(["run", "--build", str(project), "--push", registry.address, "--",
                                     "python", "app.py", "wait"], "waiting", cwd=project, env=env)
    assert code == 130, out + err
    assert wait_no_pods(core, session_of(err)) == []


def test_detached_master_is_listed_logged_and_stopped(project, registry, env, core):
    done = fiber("run", "--detach", "--build", str(project), "--push", registry.address, "--",
                 "python", "app.py", "wait", cwd=project, env=env)
    assert done.returncode == 0, done.stderr
    session = done.stdout.strip()
    try:
        rows: list[list[str]] = []
        for _ in range(120):
            rows = [r.split() for r in fiber("ps", "--session", session, env=env).stdout.splitlines()[1:]]
            if len([r for r in rows if r[2].startswith("Pool-") and r[3] == "running"]) == 2:
                break
            time.sleep(0.5)
        master = [r[1] for r in rows if r[2] == "master"]
        assert len(master) == 1 and len(rows) == 3, rows
        for _ in range(60):
            logs = fiber("logs", master[0], env=env)
            if "waiting" in logs.stdout:
                break
            time.sleep(0.5)
        assert "squares [0, 1, 4, 9, 16, 25]" in logs.stdout
        stopped = fiber("stop", session, env=env)
        assert stopped.returncode == 0 and "of session" in stopped.stdout
        assert wait_no_pods(core, session) == []
    finally:
        fiber("stop", session, env=env)


def test_doctor_checks_the_cluster(env):
    done = fiber("doctor", "--backend", "kubernetes", env=env)
    assert done.returncode == 0, done.stdout
    assert "ok   Kubernetes API reachable: namespace default" in done.stdout
    assert "ok   may list pods" in done.stdout and "ok   may read the session's secret" in done.stdout
    unreachable = fiber("doctor", "--backend", "kubernetes", env={**env, "FIBER_K8S_KUBECONFIG": "/nonexistent"})
    assert unreachable.returncode == 1 and "fix: set k8s_kubeconfig" in unreachable.stdout
