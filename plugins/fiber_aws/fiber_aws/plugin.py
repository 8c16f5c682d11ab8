"""AWS Batch backend: every Fiber process is a Batch job (``FIBER_BACKEND=aws``).

Create = SubmitJob (overrides for command, environment, vCPU/memory/GPU), status and
wait from batched DescribeJobs (:mod:`fiber_aws.tracker`), terminate = TerminateJob,
logs from CloudWatch Logs, the session secret in SSM Parameter Store. Any
AWS-compatible endpoint works through ``aws_endpoint_url`` (the tests use moto's
server). The work is in :mod:`fiber_aws.engine` (boto3 is imported on first use); this
module is the declarations. See the README for IAM, networking and the differences
between moto and AWS.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fibercore import hookimpl
from fibercore.backendkit import EngineBackend

if TYPE_CHECKING:
    from fiber_aws.engine import Engine
    from fibercore.types import ConfigView, Option

NAME = "aws"


class AwsBackend(EngineBackend["Engine"]):
    FIBER_CONTRACT = 3
    NAME = NAME
    DISTRIBUTION = "fiber-aws"
    ENGINE_KEYS = ("aws_region", "aws_profile", "aws_endpoint_url", "aws_retry_mode", "aws_max_attempts",
                   "aws_poll_interval")
    follows_logs = True
    reach_check = "AWS Batch reachable with these credentials"
    reach_fix = "set credentials (AWS_PROFILE / aws_profile, or the environment) and aws_region"

    def make_engine(self, config: ConfigView) -> Engine:
        from fiber_aws.engine import Engine

        return Engine(config)

    @hookimpl
    def fiber_config_options(self) -> list[Option]:
        opt = self.option
        return [
            opt("aws_region", str, None, "AWS region (default: AWS_REGION / the profile's)."),
            opt("aws_profile", str, None, "Named profile from ~/.aws/config (default: the environment's credentials)."),
            opt("aws_endpoint_url", str, None,
                "Endpoint of an AWS-compatible service (moto, LocalStack) for Batch, Logs and SSM."),
            opt("aws_job_queue", str, None, "Batch job queue (name or ARN) the jobs are submitted to. Required."),
            opt("aws_job_definition", str, None,
                "Registered job definition to use (name, name:revision or ARN); default: fibercore registers "
                "fiber-<hash> from image, cpu/mem/gpu_per_job and the roles, once."),
            opt("aws_job_role_arn", str, None, "IAM role the jobs run with (reads the SSM secret, calls AWS)."),
            opt("aws_execution_role_arn", str, None,
                "Execution role (required on Fargate: pulls the image, writes logs)."),
            opt("aws_platform", str, "EC2", "EC2 or FARGATE compute environments.", ("EC2", "FARGATE")),
            opt("aws_public_ip", bool, False, "Fargate: give jobs a public IP (needed without a NAT gateway to pull "
                                              "images)."),
            opt("aws_tags", str, None, "Extra tags on every job: KEY=VALUE,... (jobs always carry fiber-session and "
                                       "fiber-process)."),
            opt("aws_environment", str, None,
                "Extra environment for the jobs: KEY=VALUE,... (visible in DescribeJobs: no credentials here)."),
            opt("aws_secret_store", str, "ssm",
                "How jobs get the session secret: ssm (a SecureString parameter; the job reads it) or "
                "environment (plain, visible in DescribeJobs).", ("ssm", "environment")),
            opt("aws_ssm_prefix", str, "/fibercore", "SSM path under which session secrets are stored."),
            opt("aws_kms_key", str, None, "KMS key for the SSM SecureString (default: the account's aws/ssm key)."),
            opt("aws_log_group", str, "/aws/batch/job", "CloudWatch Logs group of the jobs' output."),
            opt("aws_poll_interval", float, 1.0, "Seconds between DescribeJobs polls (100 jobs per call)."),
            opt("aws_retry_mode", str, "adaptive", "botocore retry mode.", ("standard", "adaptive", "legacy")),
            opt("aws_max_attempts", int, 10, "Attempts per AWS call (botocore retries)."),
            opt("aws_submit_retries", int, 5, "Extra SubmitJob tries after throttling, with backoff up to 8 s."),
            opt("aws_job_listen_host", str, None,
                "Address a Batch job advertises for the processes it starts (default: its task's IP)."),
        ]

    @hookimpl
    def fiber_config_defaults(self) -> dict[str, Any]:
        """Submitting is one API call: a Pool submits all its jobs at once. Batch jobs can
        wait in RUNNABLE for capacity, so starting waits up to 10 minutes."""
        return {"pool_start_concurrency": 0, "start_timeout": 600.0}

    @hookimpl
    def fiber_listen_host(self, config: ConfigView) -> str:
        from fiber_aws.engine import listen_host

        return listen_host(config)

    @hookimpl
    def fiber_job_secret(self, session: str, config: ConfigView) -> str | None:
        """In a Batch job: read the session secret from the SSM parameter the master named."""
        from fiber_aws import secret
        from fiber_aws.clients import Clients
        from fiber_aws.requests import SECRET_PARAM_ENV

        name = os.environ.get(SECRET_PARAM_ENV)
        if not name:
            return None
        return secret.fetch(Clients(config)("ssm"), name)


plugin = AwsBackend()
