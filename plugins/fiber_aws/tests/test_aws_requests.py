"""Request shapes and bookkeeping, checked against botocore's service model with Stubber
(where moto is not precise: it ignores resource overrides, has no exitCode in
DescribeJobs and never throttles)."""

from __future__ import annotations

import threading
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from fiber_aws.clients import AwsSetupError, Clients, call_with_backoff, explain
from fiber_aws.requests import AwsOptionError, job_definition, job_name, parse_pairs, submit_request
from fiber_aws.tracker import BatchJob, Tracker, exit_code
from hypothesis import given
from hypothesis import strategies as st

from fibercore.types import JobSpec


def _batch() -> Any:
    return boto3.client("batch", region_name="eu-west-1", aws_access_key_id="a", aws_secret_access_key="b")


def _spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {
        "args": ["-m", "fibercore.worker"],
        "session": "0123456789ab",
        "env": {"FIBER_SESSION": "0123456789ab", "FIBER_MASTER_ADDR": "tcp://10.0.0.5:4000"},
        "secret_env": {"FIBER_SECRET": "cd" * 32},
        "name": "Pool-1-Worker-3",
        "labels": {"fiber-session": "0123456789ab", "fiber-process": "Pool-1-Worker-3"},
    }
    base.update(kw)
    return JobSpec(**base)


CFG = {"aws_job_queue": "rl-queue", "aws_tags": "team=rl", "aws_environment": "WANDB_MODE=offline"}


def test_submit_job_request_passes_the_service_model() -> None:
    request = submit_request(_spec(cpu=4, memory=8192, gpu=1), CFG, session="0123456789ab",
                             definition="arn:aws:batch:eu-west-1:1:job-definition/fiber-x:1",
                             secret_param="/fibercore/0123456789ab/secret")
    assert request["jobName"] == "fiber-0123456789ab-Pool-1-Worker-3"
    overrides = request["containerOverrides"]
    assert overrides["command"] == ["python", "-m", "fibercore.worker"]
    assert overrides["resourceRequirements"] == [
        {"type": "VCPU", "value": "4"}, {"type": "MEMORY", "value": "8192"}, {"type": "GPU", "value": "1"}]
    env = {e["name"]: e["value"] for e in overrides["environment"]}
    assert env["FIBERCORE_AWS_SECRET_PARAM"] == "/fibercore/0123456789ab/secret"
    assert env["WANDB_MODE"] == "offline" and env["FIBER_MASTER_ADDR"] == "tcp://10.0.0.5:4000"
    assert "FIBER_SECRET" not in env and "cd" * 32 not in env.values()
    assert request["tags"] == {"team": "rl", "fiber-session": "0123456789ab", "fiber-process": "Pool-1-Worker-3"}
    batch = _batch()
    with Stubber(batch) as stub:  # Stubber validates the parameters against Batch's model
        stub.add_response("submit_job", {"jobName": request["jobName"], "jobId": "j-1"}, request)
        assert batch.submit_job(**request)["jobId"] == "j-1"


def test_fractional_vcpus_and_no_overrides_without_resources() -> None:
    request = submit_request(_spec(cpu=0.25), CFG, session="s", definition="d", secret_param=None)
    assert request["containerOverrides"]["resourceRequirements"] == [{"type": "VCPU", "value": "0.25"}]
    bare = submit_request(_spec(), CFG, session="s", definition="d", secret_param=None)
    assert "resourceRequirements" not in bare["containerOverrides"]
    env = {e["name"]: e["value"] for e in bare["containerOverrides"]["environment"]}
    assert env["FIBER_SECRET"] == "cd" * 32  # aws_secret_store=environment


def test_job_definition_is_named_by_its_content() -> None:
    one = job_definition("me/rl:1", {"aws_job_role_arn": "arn:aws:iam::1:role/r"})
    again = job_definition("me/rl:1", {"aws_job_role_arn": "arn:aws:iam::1:role/r"})
    other = job_definition("me/rl:2", {"aws_job_role_arn": "arn:aws:iam::1:role/r"})
    assert one == again and one["jobDefinitionName"] != other["jobDefinitionName"]
    assert one["containerProperties"]["jobRoleArn"] == "arn:aws:iam::1:role/r"
    assert one["retryStrategy"] == {"attempts": 1}
    fargate = job_definition("me/rl:1", {"aws_platform": "FARGATE", "aws_execution_role_arn": "arn:e",
                                         "cpu_per_job": 0.5})
    assert fargate["platformCapabilities"] == ["FARGATE"]
    assert {"type": "VCPU", "value": "0.5"} in fargate["containerProperties"]["resourceRequirements"]
    batch = _batch()
    with Stubber(batch) as stub:
        for body in (one, fargate):
            stub.add_response("register_job_definition", {"jobDefinitionName": body["jobDefinitionName"],
                                                          "jobDefinitionArn": "arn:x", "revision": 1}, body)
            batch.register_job_definition(**body)


def test_describe_jobs_is_batched_100_per_call() -> None:
    batch = _batch()
    ids = [f"job-{i:03d}" for i in range(250)]
    with Stubber(batch) as stub:
        for chunk in (ids[:100], ids[100:200], ids[200:]):
            stub.add_response("describe_jobs", {"jobs": [
                {"jobName": f"n-{j}", "jobId": j, "jobQueue": "q", "status": "RUNNING", "startedAt": 1,
                 "jobDefinition": "d"} for j in chunk]}, {"jobs": chunk})
        tracker = Tracker(lambda chunk: batch.describe_jobs(jobs=chunk)["jobs"], interval=3600)
        for j in ids:
            tracker.add(BatchJob(j, f"n-{j}"))
        tracker.poll_once()
        stub.assert_no_pending_responses()
    assert tracker.calls == 3
    assert {j.status for j in tracker.jobs.values()} == {"RUNNING"}


def test_finished_jobs_are_no_longer_described_and_exit_codes_follow_multiprocessing() -> None:
    answers = {"a": {"jobId": "a", "status": "SUCCEEDED", "container": {"exitCode": 0}},
               "b": {"jobId": "b", "status": "FAILED", "container": {"exitCode": 137}},
               "c": {"jobId": "c", "status": "FAILED"},
               "d": {"jobId": "d", "status": "RUNNING"}}
    asked: list[list[str]] = []

    def describe(chunk: list[str]) -> list[dict[str, Any]]:
        asked.append(chunk)
        return [answers[j] for j in chunk if j in answers]

    tracker = Tracker(describe, interval=3600, find_exit=lambda job: 3 if job.job_id == "c" else None)
    jobs = {j: BatchJob(j, j) for j in "abcde"}
    for job in jobs.values():
        tracker.add(job)
    tracker.poll_once()
    assert [tracker.wait(jobs[j], 0) for j in "abc"] == [0, -9, 3]
    assert tracker.wait(jobs["d"], 0) is None
    assert jobs["e"].missing and jobs["e"].done.is_set()  # not known to Batch (any more)
    tracker.poll_once()
    assert asked[-1] == ["d"]


@given(st.integers(min_value=0, max_value=255))
def test_exit_code_mapping(code: int) -> None:
    job = BatchJob("x", "x")
    job.status, job.container_exit = "FAILED", code
    assert exit_code(job) == (-(code - 128) if 128 < code <= 192 else code)


def test_terminated_without_an_exit_code_reads_as_a_signal() -> None:
    job = BatchJob("x", "x")
    job.status, job.terminated = "FAILED", False
    assert exit_code(job) == -15
    job.terminated = True
    assert exit_code(job) == -9


def test_submit_retries_throttling_with_bounded_backoff() -> None:
    batch = _batch()
    pauses: list[float] = []
    request = {"jobName": "fiber-s-p", "jobQueue": "q", "jobDefinition": "d"}
    with Stubber(batch) as stub:
        for _ in range(2):
            stub.add_client_error("submit_job", "TooManyRequestsException", "Too Many Requests", 429)
        stub.add_response("submit_job", {"jobName": "fiber-s-p", "jobId": "j-9"}, request)
        answer = call_with_backoff(lambda: batch.submit_job(**request), 5, "submitting", sleep=pauses.append)
    assert answer["jobId"] == "j-9" and len(pauses) == 2 and all(0 < p <= 8 for p in pauses)
    with Stubber(batch) as stub:
        for _ in range(4):
            stub.add_client_error("submit_job", "TooManyRequestsException", "Too Many Requests", 429)
        with pytest.raises(Exception, match="TooManyRequests"):
            call_with_backoff(lambda: batch.submit_job(**request), 3, "submitting", sleep=pauses.append)
        stub.assert_no_pending_responses()  # 1 try + 3 retries, then it gives up


def test_non_retryable_errors_are_not_retried() -> None:
    batch = _batch()
    with Stubber(batch) as stub:
        stub.add_client_error("submit_job", "ClientException", "JobQueue q not found", 400)
        with pytest.raises(AwsSetupError, match="AWS Batch refused the request"):
            call_with_backoff(lambda: batch.submit_job(jobName="a", jobQueue="q", jobDefinition="d"), 5,
                              "submitting", sleep=lambda s: pytest.fail("slept"))


def test_credentials_and_region_errors_say_what_to_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(AwsSetupError, match="no AWS region; set aws_region"):
        Clients({})("batch")
    client = Clients({"aws_region": "eu-west-1", "aws_max_attempts": 1})("batch")
    with pytest.raises(Exception) as info:
        client.describe_jobs(jobs=["x"])
    err = explain(info.value, "describing jobs")
    assert isinstance(err, AwsSetupError) and "no AWS credentials; set aws_profile" in str(err)
    with pytest.raises(AwsSetupError, match="check aws_profile"):
        Clients({"aws_region": "eu-west-1", "aws_profile": "nope"})("batch")


def test_bad_option_values_say_the_expected_form() -> None:
    with pytest.raises(AwsOptionError, match="KEY=VALUE"):
        parse_pairs("team", "aws_tags")
    with pytest.raises(AwsOptionError, match="aws_job_queue"):
        submit_request(_spec(), {}, session="s", definition="d", secret_param=None)
    with pytest.raises(AwsOptionError, match="reserved"):
        submit_request(_spec(), {**CFG, "aws_environment": "AWS_BATCH_X=1"}, session="s", definition="d",
                       secret_param=None)


@given(st.text(max_size=200))
def test_job_names_are_valid(process_name: str) -> None:
    import re

    name = job_name("0123456789ab", process_name)
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}", name)


def test_tracker_thread_polls_until_jobs_finish() -> None:
    seen = threading.Event()
    calls: list[int] = []

    def describe(chunk: list[str]) -> list[dict[str, Any]]:
        calls.append(len(chunk))
        if len(calls) >= 3:
            seen.set()
            return [{"jobId": j, "status": "SUCCEEDED"} for j in chunk]
        return [{"jobId": j, "status": "RUNNING"} for j in chunk]

    tracker = Tracker(describe, interval=0.05)
    job = BatchJob("t", "t")
    tracker.add(job)
    assert tracker.wait(job, 10) == 0 and seen.is_set()
    count = len(calls)
    threading.Event().wait(0.3)
    assert len(calls) == count  # nothing left to describe: no more calls
