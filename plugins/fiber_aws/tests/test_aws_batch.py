"""End to end on moto's Batch (a Pool surviving TerminateJob is in the conformance suite,
test_aws_conformance.py): what DescribeJobs shows; job definitions reused; cleanup; logs and exit codes."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aws_helpers import QUEUE, client

import fibercore as fc
from fibercore.testing.targets import exit_with, sleep_for


@pytest.fixture
def aws(aws_config: dict[str, Any], fiber_backend_init: Any) -> Any:
    return lambda **extra: fiber_backend_init(backend="aws", **{**aws_config, **extra})


def _describe(moto_url: str, job_id: str) -> dict[str, Any]:
    return client(moto_url, "batch").describe_jobs(jobs=[job_id])["jobs"][0]


def test_what_describe_jobs_shows(aws: Any, moto_url: str) -> None:
    """Name, tags, overrides; the session secret is not there, only the SSM parameter's name."""
    # Resources from the config: fc.meta(...)(sleep_for) would mark the shared sleep_for for
    # every later test of the run (it did: a Slurm test then saw memory=1024).
    aws(aws_tags="team=rl,fiber-test-run=x", cpu_per_job=2, mem_per_job=1024)
    p = fc.Process(target=sleep_for, args=(30,), name="described")
    p.start()
    try:
        described = _describe(moto_url, p.job.jid)
        rt = fc.get_runtime()
        assert described["jobName"] == f"fiber-{rt.session}-described"
        assert described["tags"]["fiber-session"] == rt.session
        assert described["tags"]["fiber-process"] == "described" and described["tags"]["team"] == "rl"
        env = {e["name"]: e["value"] for e in described["container"]["environment"]}
        assert env["FIBERCORE_AWS_SECRET_PARAM"] == f"/fibercore/{rt.session}/secret"
        assert "FIBER_SECRET" not in env
        assert not any(rt.secret.hex() in value for value in env.values())
        assert described["container"]["command"] == ["python", "-m", "fibercore.worker"]
        ssm = client(moto_url, "ssm")
        stored = ssm.get_parameter(Name=env["FIBERCORE_AWS_SECRET_PARAM"], WithDecryption=True)["Parameter"]
        assert stored["Type"] == "SecureString" and stored["Value"] == rt.secret.hex()
    finally:
        p.terminate()
        p.join(60)
    assert p.exitcode == -15


def test_job_definition_is_registered_once_and_reused(aws: Any, moto_url: str, worker_image: str) -> None:
    aws()
    procs = [fc.Process(target=sleep_for, args=(0,)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
        assert p.exitcode == 0
    batch = client(moto_url, "batch")
    arns = {_describe(moto_url, p.job.jid)["jobDefinition"] for p in procs}
    assert len(arns) == 1
    name = arns.pop().split("/")[-1].split(":")[0]
    assert name.startswith("fiber-")
    defs = batch.describe_job_definitions(jobDefinitionName=name)["jobDefinitions"]
    assert len(defs) == 1 and defs[0]["containerProperties"]["image"] == worker_image
    aws(mem_per_job=4096)  # different content, different definition
    p = fc.Process(target=sleep_for, args=(0,))
    p.start()
    p.join(90)
    assert _describe(moto_url, p.job.jid)["jobDefinition"].split("/")[-1].split(":")[0] != name


def test_environment_secret_store_is_plain(aws: Any, moto_url: str) -> None:
    """aws_secret_store=environment: works, and DescribeJobs shows the secret (documented)."""
    aws(aws_secret_store="environment")
    p = fc.Process(target=exit_with, args=(4,))
    p.start()
    p.join(90)
    assert p.exitcode == 4
    env = {e["name"]: e["value"] for e in _describe(moto_url, p.job.jid)["container"]["environment"]}
    assert env["FIBER_SECRET"] == fc.get_runtime().secret.hex()


def test_cleanup_terminates_active_jobs_and_deletes_secrets(aws: Any, moto_url: str) -> None:
    aws()
    rt = fc.get_runtime()
    p = fc.Process(target=sleep_for, args=(60,))
    p.start()
    assert rt.plugins.cleanup_jobs(rt.session) == 1
    p.join(90)
    assert p.exitcode is not None and p.exitcode != 0
    assert _describe(moto_url, p.job.jid)["statusReason"] == "fiber cleanup"
    listed = client(moto_url, "ssm").get_parameters_by_path(Path=f"/fibercore/{rt.session}")["Parameters"]
    assert listed == []


def test_logs_before_and_after_the_job_ran(aws: Any) -> None:
    from fibercore.testing.targets import print_marker

    aws()
    p = fc.Process(target=print_marker, args=("batch-log-marker",))
    p.start()
    early = p.logs()
    assert "batch-log-marker" in early or "no logs yet" in early  # moto ships logs at the end
    p.join(90)
    assert p.exitcode == 0
    deadline = time.monotonic() + 10
    while "batch-log-marker-stderr" not in p.logs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "batch-log-marker" in p.logs() and "batch-log-marker-stderr" in p.logs()


def test_unknown_queue_is_a_clear_error(aws: Any) -> None:
    aws(aws_job_queue="no-such-queue")
    with pytest.raises(fc.ProcessError) as info:
        fc.Process(target=sleep_for, args=(0,)).start()
    assert "no-such-queue" in str(info.value) and "AWS Batch refused the request" in str(info.value)


def test_no_job_left_active_on_the_queue(aws: Any, moto_url: str) -> None:
    """Every job this module started has ended (the session fixture checks again at the end)."""
    aws()
    batch = client(moto_url, "batch")
    session = fc.get_runtime().session
    active = [j for status in ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
              for j in batch.list_jobs(jobQueue=QUEUE, jobStatus=status)["jobSummaryList"]
              if j["jobName"].startswith(f"fiber-{session}-")]
    assert active == []
