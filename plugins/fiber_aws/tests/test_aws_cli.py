"""``fiber run`` on moto's Batch: the master is a Batch job (a real container run by moto), its
output comes from CloudWatch Logs, its exit code back; ps, logs and stop find its session."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from aws_helpers import ACTIVE, QUEUE, client
from fiber_docker.testing import registry_fixture

from fibercore.testing import fiber, session_of, write_demo_project

registry = registry_fixture()  # Debian's docker-registry on 127.0.0.1


@pytest.fixture
def env(aws_config: dict[str, Any]) -> dict[str, str]:
    """The moto queue's config as FIBER_* variables (and moto's dummy credentials)."""
    values = {f"FIBER_{k.upper()}": (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in aws_config.items()}
    return {"FIBER_BACKEND": "aws", **values}


def active_jobs(moto_url: str, session: str) -> list[str]:
    batch = client(moto_url, "batch")
    return [j["jobName"] for status in ACTIVE
            for j in batch.list_jobs(jobQueue=QUEUE, jobStatus=status)["jobSummaryList"]
            if j["jobName"].startswith(f"fiber-{session}-")]


def test_run_on_batch_returns_output_and_exit_code(tmp_path: Path, registry, env, moto_url):
    project = write_demo_project(tmp_path / "demo")
    done = fiber("run", "--build", str(project), "--push", registry.address, "--", "python", "app.py", "3",
                 cwd=project, env=env, timeout=400)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "squares [0, 1, 4, 9, 16, 25] six 1.16.0" in done.stdout  # from CloudWatch Logs
    session = session_of(done.stderr)
    assert active_jobs(moto_url, session) == []
    listed = fiber("ps", "--session", session, env=env)
    rows = [r.split() for r in listed.stdout.splitlines()[1:]]
    assert {r[2].lower() for r in rows} >= {"master", "pool-1-worker-1", "pool-1-worker-2"}, listed.stdout
    master = next(r[1] for r in rows if r[2] == "master")
    assert "squares" in fiber("logs", master, env=env).stdout


def test_a_detached_master_is_stopped_with_its_jobs(tmp_path: Path, env, moto_url, registry):
    project = write_demo_project(tmp_path / "demo")
    done = fiber("run", "--detach", "--build", str(project), "--push", registry.address, "--", "python", "app.py",
                 "wait", cwd=project, env=env, timeout=400)
    assert done.returncode == 0, done.stderr
    session = done.stdout.strip()
    deadline = time.monotonic() + 120
    while len(active_jobs(moto_url, session)) < 3 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(active_jobs(moto_url, session)) == 3
    stopped = fiber("stop", session, env=env)
    assert stopped.returncode == 0, stopped.stderr
    deadline = time.monotonic() + 60
    while active_jobs(moto_url, session) and time.monotonic() < deadline:
        time.sleep(1)
    assert active_jobs(moto_url, session) == []


def test_doctor_checks_batch(env):
    done = fiber("doctor", "--backend", "aws", env=env)
    assert done.returncode == 0, done.stdout
    assert "ok   AWS Batch reachable" in done.stdout and f"ok   job queue: {QUEUE}: ENABLED" in done.stdout
    no_queue = fiber("doctor", "--backend", "aws", env={**env, "FIBER_AWS_JOB_QUEUE": "fiber-no-such-queue"})
    assert no_queue.returncode == 1 and "fix: create a Batch job queue" in no_queue.stdout
