"""The AWS Batch backend's moving parts: clients, one job tracker, job definitions, the secret.

Create = SubmitJob (overrides for command, environment, vCPU/memory/GPU), status and wait
from batched DescribeJobs (:mod:`fiber_aws.tracker`), terminate = TerminateJob, logs from
CloudWatch Logs, the session secret in SSM Parameter Store (:mod:`fiber_aws.secret`).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fiber_aws.tracker import BatchJob
from fibercore.backendkit import clean_session, outward_address, sessions_to_clean

if TYPE_CHECKING:
    from fibercore.types import Check, ConfigView, Job, JobInfo, JobSpec, JobStatus

NAME = "aws"
TERMINAL_STATES = ("SUCCEEDED", "FAILED")
ACTIVE_STATES = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")
_LOG_TAIL = 64 * 1024


class Engine:
    """One per account, region and endpoint: clients, the job tracker, definitions, the secret."""

    def __init__(self, cfg: Any) -> None:
        from fiber_aws.clients import Clients
        from fiber_aws.tracker import Tracker

        self.cfg = cfg
        self.clients = Clients(cfg)
        self.definitions: dict[str, str] = {}
        self.owned_secrets: dict[str, str] = {}  # session -> parameter this process created
        self.lock = threading.Lock()
        self.tracker = Tracker(self._describe, float(cfg.get("aws_poll_interval") or 1.0), self._find_exit)

    # -- calls ------------------------------------------------------------------------
    def _describe(self, ids: list[str]) -> list[dict[str, Any]]:
        return list(self.clients("batch").describe_jobs(jobs=ids)["jobs"])

    def _find_exit(self, job: Any) -> int | None:
        """A FAILED job's exit code when DescribeJobs lacks it (moto): its ListJobs summary."""
        queue = self.cfg.get("aws_job_queue")
        if not queue:
            return None
        listed = self.clients("batch").list_jobs(jobQueue=queue, filters=[{"name": "JOB_NAME", "values": [job.name]}])
        for summary in listed.get("jobSummaryList", []):
            if summary.get("jobId") == job.job_id:
                code = (summary.get("container") or {}).get("exitCode")
                return None if code is None else int(code)
        return None

    def definition(self, image: str) -> str:
        """The configured job definition, or fibercore's for ``image`` (registered once)."""
        from fiber_aws.clients import reraise
        from fiber_aws.requests import job_definition

        configured = self.cfg.get("aws_job_definition")
        if configured:
            return str(configured)
        body = job_definition(image, self.cfg)
        name = body["jobDefinitionName"]
        with self.lock:
            if name in self.definitions:
                return self.definitions[name]
            batch = self.clients("batch")
            try:
                found = batch.describe_job_definitions(jobDefinitionName=name, status="ACTIVE")["jobDefinitions"]
                if found:
                    arn = max(found, key=lambda d: d["revision"])["jobDefinitionArn"]
                else:
                    arn = batch.register_job_definition(**body)["jobDefinitionArn"]
            except Exception as exc:
                reraise(exc, f"registering the job definition {name} for image {image}")
            self.definitions[name] = arn
            return arn

    def secret_parameter(self, session: str, secret_hex: str) -> str | None:
        """The SSM parameter holding the secret (stored on first use), or None to use the environment."""
        from fiber_aws import secret
        from fiber_aws.requests import SECRET_PARAM_ENV

        if (self.cfg.get("aws_secret_store") or "ssm") != "ssm":
            return None
        inherited = os.environ.get(SECRET_PARAM_ENV)
        if inherited and os.environ.get("FIBER_SESSION") == session:
            return inherited  # a job starting jobs: the master's parameter
        with self.lock:
            name = self.owned_secrets.get(session)
            if name is None:
                name = secret.parameter_name(self.cfg.get("aws_ssm_prefix") or "/fibercore", session)
                secret.store(self.clients("ssm"), name, secret_hex, session, self.cfg.get("aws_kms_key"))
                self.owned_secrets[session] = name
            return name

    def create(self, spec: JobSpec, config: ConfigView) -> Job:
        """SubmitJob for ``spec`` (the secret in SSM Parameter Store unless configured otherwise)."""
        from fibercore.types import Job

        self.cfg = config  # the settings that are not the engine's key follow the current config
        job, command = self.submit(spec)
        return Job(jid=job.job_id, backend=NAME, data=job, host=None, pid=None, spec=spec, command=command)

    def status(self, job: BatchJob) -> JobStatus:
        from fibercore.types import JobStatus

        if job.done.is_set():
            return JobStatus.UNKNOWN if job.missing else JobStatus.EXITED
        return JobStatus.RUNNING if job.status == "RUNNING" else JobStatus.PENDING

    def wait(self, job: BatchJob, timeout: float | None) -> int | None:
        return self.tracker.wait(job, timeout)

    def submit(self, spec: JobSpec) -> tuple[BatchJob, list[str]]:
        """Submit ``spec``: the tracked job and the command line it runs."""
        from fiber_aws.clients import AwsSetupError, call_with_backoff
        from fiber_aws.requests import submit_request
        from fiber_aws.tracker import BatchJob

        image = spec.image or self.cfg.get("default_image")
        if not image and not self.cfg.get("aws_job_definition"):
            raise AwsSetupError(
                "no image for the Batch jobs: set image=... (FIBER_IMAGE) to an image your compute "
                "environment can pull (e.g. from ECR; `python -m fiber_docker.image` builds one), or "
                "aws_job_definition to a registered definition"
            )
        secret_hex = spec.secret_env.get("FIBER_SECRET", "")
        session = spec.session
        request = submit_request(spec, self.cfg, session=session, definition=self.definition(str(image)),
                                 secret_param=self.secret_parameter(session, secret_hex) if secret_hex else None)
        batch = self.clients("batch")
        answer = call_with_backoff(lambda: batch.submit_job(**request), int(self.cfg.get("aws_submit_retries") or 5),
                                   f"submitting Batch job {request['jobName']} to queue {request['jobQueue']}")
        job = BatchJob(answer["jobId"], request["jobName"])
        self.tracker.add(job)
        self.tracker.poke()
        return job, list(request["containerOverrides"]["command"])

    def terminate(self, job: BatchJob, force: bool) -> None:
        from fiber_aws.clients import error_code, reraise

        if job.done.is_set():
            return
        if job.terminated is None or force:
            job.terminated = force
        reason = "fibercore: " + ("kill()" if force else "terminate()")
        try:
            self.clients("batch").terminate_job(jobId=job.job_id, reason=reason)
        except Exception as exc:
            if error_code(exc) != "ClientException":  # unknown or finished job: nothing to stop
                reraise(exc, f"terminating Batch job {job.job_id}")
        self.tracker.poke()

    def logs(self, job: BatchJob) -> str:
        from fiber_aws.clients import error_code

        if job.log_stream is None:
            try:  # one describe for this job, on demand (e.g. to explain a failed start)
                described = self._describe([job.job_id])
                if described:
                    job.update(described[0])
            except Exception:
                pass
        group = self.cfg.get("aws_log_group") or "/aws/batch/job"
        if job.log_stream is None:
            return (f"(no logs yet for Batch job {job.name} [{job.job_id}], status {job.status}: Batch writes a "
                    f"job's output to CloudWatch Logs group {group} once its container runs)")
        logs = self.clients("logs")
        lines: list[str] = []
        size = 0
        kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": job.log_stream, "startFromHead": True}
        try:
            while True:
                page = logs.get_log_events(**kwargs)
                for event in page.get("events", []):
                    lines.append(event.get("message", ""))
                    size += len(lines[-1]) + 1
                token = page.get("nextForwardToken")
                if not page.get("events") or token == kwargs.get("nextToken") or size > 4 * _LOG_TAIL:
                    break
                kwargs["nextToken"] = token
        except Exception as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return f"(no logs yet in {group}/{job.log_stream} for Batch job {job.name}, status {job.status})"
            return f"(could not read the logs of Batch job {job.name} from {group}/{job.log_stream}: {exc})"
        text = "\n".join(lines)
        return text[-_LOG_TAIL:]

    # -- operations (the fiber command, from any process) ------------------------------
    def _summaries(self, session: str | None) -> list[dict[str, Any]]:
        """ListJobs of the queue for the session's job names, every status."""
        queue = self.cfg.get("aws_job_queue")
        if not queue:
            return []
        batch = self.clients("batch")
        pattern = f"fiber-{session}-*" if session else "fiber-*"
        kwargs: dict[str, Any] = {"jobQueue": queue, "filters": [{"name": "JOB_NAME", "values": [pattern]}]}
        out: list[dict[str, Any]] = []
        while True:
            page = batch.list_jobs(**kwargs)
            out += page.get("jobSummaryList", [])
            if not page.get("nextToken"):
                return out
            kwargs["nextToken"] = page["nextToken"]

    def list_jobs(self, session: str | None) -> list[JobInfo]:
        from fibercore.types import JobInfo, JobStatus

        ids = [s["jobId"] for s in self._summaries(session)]
        out = []
        for i in range(0, len(ids), 100):  # DescribeJobs takes 100 ids: the tags, image, exit code
            for job in self._describe(ids[i:i + 100]):
                tags = job.get("tags") or {}
                state = job.get("status", "")
                status = (JobStatus.RUNNING if state == "RUNNING" else JobStatus.EXITED
                          if state in ("SUCCEEDED", "FAILED") else JobStatus.PENDING)
                container = job.get("container") or {}
                created = job.get("createdAt")
                out.append(JobInfo(jid=job["jobId"], backend=NAME, session=tags.get("fiber-session", "?"),
                                   name=tags.get("fiber-process", job.get("jobName", "?")), status=status,
                                   image=container.get("image"), exitcode=container.get("exitCode"),
                                   created=created / 1000 if created else None))
        return out

    def read_logs(self, jid: str) -> str | None:
        """The output of Batch job ``jid`` of a fiber session, from any process (None: not one)."""
        job = self.job_by_id(jid)
        return None if job is None else self.logs(job)

    def job_by_id(self, jid: str) -> BatchJob | None:
        """A tracker record for Batch job ``jid`` of a fiber session, or None."""
        from fiber_aws.tracker import BatchJob

        try:
            described = self._describe([jid])
        except Exception:
            return None
        if not described or not described[0].get("jobName", "").startswith("fiber-"):
            return None
        job = BatchJob(jid, described[0]["jobName"])
        job.update(described[0])
        return job

    def follow(self, job: BatchJob) -> Iterator[str]:
        """The job's CloudWatch log events as they arrive, until the job has ended."""
        group = self.cfg.get("aws_log_group") or "/aws/batch/job"
        logs = self.clients("logs")
        token: str | None = None
        drains = 0
        interval = float(self.cfg.get("aws_poll_interval") or 1.0)
        while True:
            finished = job.done.is_set()
            if job.log_stream is None and not finished:
                job.done.wait(interval)
                continue
            while job.log_stream is not None:
                kwargs: dict[str, Any] = {"logGroupName": group, "logStreamName": job.log_stream, "startFromHead": True}
                if token:
                    kwargs["nextToken"] = token
                try:
                    page = logs.get_log_events(**kwargs)
                except Exception:
                    break  # the stream is not there yet
                for event in page.get("events", []):
                    yield event.get("message", "") + "\n"
                if not page.get("events") or page.get("nextForwardToken") == token:
                    break
                token = page.get("nextForwardToken")
            if finished:
                if token is None and drains < 10:  # Batch (and moto) may write the last events late
                    drains += 1
                    time.sleep(0.5)
                    continue
                return
            job.done.wait(interval)

    def cleanup(self, session: str | None) -> int:
        """Terminate the active jobs of ``session`` and delete its secrets; None: of every session
        whose master is gone (:func:`fibercore.backendkit.sessions_to_clean`, by the jobs' tags)."""
        if session is not None:
            return self._cleanup_session(session)
        ids = [s["jobId"] for s in self._summaries(None)]
        jobs = []
        for i in range(0, len(ids), 100):  # DescribeJobs takes 100 ids: the tags
            for job in self._describe(ids[i:i + 100]):
                tags = job.get("tags") or {}
                jobs.append((tags.get("fiber-session", ""), tags, job.get("status") in ACTIVE_STATES))
        return sum(self._cleanup_session(s) for s in sessions_to_clean(jobs))

    def _cleanup_session(self, session: str) -> int:
        """Terminate the active jobs of ``session`` (its master first), delete its secrets."""
        from fiber_aws import secret

        count = 0
        if self.cfg.get("aws_job_queue"):
            batch = self.clients("batch")

            def find() -> list[tuple[str, bool]]:
                return [(s["jobId"], s.get("jobName", "").endswith("-master")) for s in self._summaries(session)
                        if s.get("status") in ACTIVE_STATES]

            count = clean_session(find, lambda ids: [batch.terminate_job(jobId=i, reason="fiber cleanup")
                                                      for i in ids], passes=1)
        if (self.cfg.get("aws_secret_store") or "ssm") == "ssm":
            secret.delete_session(self.clients("ssm"), self.cfg.get("aws_ssm_prefix") or "/fibercore", session)
            with self.lock:  # stored again if this process submits more jobs
                self.owned_secrets.pop(session, None)
        return count

    def close(self) -> None:
        """At exit: stop what still runs, delete the secrets this process stored."""
        from fiber_aws import secret

        for job in self.tracker.active():
            try:
                self.terminate(job, True)
            except Exception:
                pass
        for name in list(self.owned_secrets.values()):
            secret.delete(self.clients("ssm"), name)
        self.owned_secrets.clear()

    def doctor(self, config: ConfigView) -> list[Check]:
        """Batch answers with these credentials; the job queue is enabled; an image is set."""
        from fibercore.types import Check

        queue = config.get("aws_job_queue")
        try:
            found = self.clients("batch").describe_job_queues(jobQueues=[queue] if queue else [])["jobQueues"]
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}"
            if "region" in str(exc).lower():
                fix = "set aws_region (FIBER_AWS_REGION) or AWS_DEFAULT_REGION to the region of your Batch queue"
            elif "endpoint" in str(exc).lower() or "connect" in str(exc).lower():
                fix = "check aws_endpoint_url (FIBER_AWS_ENDPOINT_URL) and the network path to it"
            else:
                fix = "set credentials (AWS_PROFILE / aws_profile, or the environment) with batch:Describe* rights"
            return [Check(NAME, "AWS Batch reachable with these credentials", False, text, fix)]
        checks = [Check(NAME, "AWS Batch reachable with these credentials", True,
                        config.get("aws_endpoint_url") or f"region {config.get('aws_region') or 'default'}")]
        state = next((q for q in found if queue in (q.get("jobQueueName"), q.get("jobQueueArn"))), None)
        checks.append(Check(NAME, "job queue", bool(state and state.get("state") == "ENABLED"),
                            f"{queue}: {state.get('state') + ', ' + state.get('status', '') if state else 'not found'}"
                            if queue else "aws_job_queue is not set",
                            "create a Batch job queue and set aws_job_queue (FIBER_AWS_JOB_QUEUE) to its name"))
        image = config.get("image") or config.get("default_image")
        checks.append(Check(NAME, "worker image set", bool(image or config.get("aws_job_definition")), image or "",
                            "set image= to an image the compute environment can pull (ECR), or aws_job_definition"))
        return checks


def _task_ip() -> str | None:
    """Inside ECS/Batch: this task's IPv4 address from the container metadata endpoint."""
    uri = os.environ.get("ECS_CONTAINER_METADATA_URI_V4") or os.environ.get("ECS_CONTAINER_METADATA_URI")
    if not uri:
        return None
    import urllib.request

    try:
        with urllib.request.urlopen(uri, timeout=2) as resp:
            meta = json.load(resp)
        return str(meta["Networks"][0]["IPv4Addresses"][0])
    except Exception:
        return None


def listen_host(config: ConfigView) -> str:
    """The address Batch jobs reach this process at: a job's task IP, or, for a master outside
    Batch, the address that routes outward (jobs in a VPC must be able to reach it; README)."""
    if os.environ.get("AWS_BATCH_JOB_ID"):  # a Batch job starting jobs of its own
        return str(config.get("aws_job_listen_host") or _task_ip() or socket.gethostbyname(socket.gethostname()))
    return outward_address()
