"""From a JobSpec and the configuration to AWS Batch requests (pure functions).

- :func:`job_definition` — the RegisterJobDefinition request fibercore uses when no
  ``aws_job_definition`` is configured: image, the worker command, default resources,
  roles, named ``fiber-<hash of its content>`` so that it is registered once and reused.
- :func:`submit_request` — SubmitJob: name, queue, definition, containerOverrides
  (command, environment, vCPU/memory/GPU from the JobSpec and ``@meta``), tags.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from fibercore import backendkit

WORKER_COMMAND = ["python", "-m", "fibercore.worker"]
DEFAULT_VCPUS = 1.0
DEFAULT_MEMORY_MIB = 2048
SECRET_PARAM_ENV = "FIBERCORE_AWS_SECRET_PARAM"


class AwsOptionError(ValueError):
    """An aws_* config value cannot be used; the message shows the expected form."""


def parse_pairs(text: str | None, key: str) -> dict[str, str]:
    """``"a=1,b=2"`` -> ``{"a": "1", "b": "2"}`` (for aws_tags and aws_environment)."""
    return backendkit.parse_pairs(text, key, AwsOptionError, "team=rl,project=es")


def job_name(session: str, process_name: str) -> str:
    """Batch job names: letters, digits, - and _, at most 128, first a letter or digit."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", process_name).strip("-_")[:80] or "job"
    return f"fiber-{session}-{slug}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{float(value):g}"


def resources(cpu: float | None, memory: int | None, gpu: int | None) -> list[dict[str, str]]:
    """Batch resourceRequirements: VCPU (may be fractional on Fargate), MEMORY in MiB, GPU."""
    out = []
    if cpu:
        out.append({"type": "VCPU", "value": _number(cpu)})
    if memory:
        out.append({"type": "MEMORY", "value": str(int(memory))})
    if gpu:
        out.append({"type": "GPU", "value": str(int(gpu))})
    return out


def job_definition(image: str, cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The RegisterJobDefinition request for ``image``; its name hashes its content."""
    props: dict[str, Any] = {
        "image": image,
        "command": list(WORKER_COMMAND),
        "resourceRequirements": resources(
            cfg.get("cpu_per_job") or DEFAULT_VCPUS, cfg.get("mem_per_job") or DEFAULT_MEMORY_MIB,
            cfg.get("gpu_per_job"),
        ),
    }
    if cfg.get("aws_job_role_arn"):
        props["jobRoleArn"] = cfg["aws_job_role_arn"]
    if cfg.get("aws_execution_role_arn"):
        props["executionRoleArn"] = cfg["aws_execution_role_arn"]
    platform = (cfg.get("aws_platform") or "EC2").upper()
    if platform == "FARGATE":
        props["networkConfiguration"] = {"assignPublicIp": "ENABLED" if cfg.get("aws_public_ip") else "DISABLED"}
        props["fargatePlatformConfiguration"] = {"platformVersion": "LATEST"}
    body: dict[str, Any] = {
        "type": "container",
        "containerProperties": props,
        "platformCapabilities": [platform],
        "retryStrategy": {"attempts": 1},  # fibercore reruns a lost worker's tasks itself
        "propagateTags": True,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {"jobDefinitionName": f"fiber-{digest}", **body, "tags": {"fiber-managed": "true"}}


def submit_request(
    spec: Any,
    cfg: Mapping[str, Any],
    *,
    session: str,
    definition: str,
    secret_param: str | None,
) -> dict[str, Any]:
    """The SubmitJob request for ``spec`` (fibercore.types.JobSpec)."""
    queue = cfg.get("aws_job_queue")
    if not queue:
        raise AwsOptionError("no job queue: set aws_job_queue (FIBER_AWS_JOB_QUEUE) to your Batch job queue's name or "
                             "ARN")
    command = spec.argv("python")  # unless python_exe was set: the image's, found on its PATH
    env = dict(parse_pairs(cfg.get("aws_environment"), "aws_environment"))
    env.update(spec.env)
    env["PYTHONUNBUFFERED"] = "1"
    if secret_param:
        env[SECRET_PARAM_ENV] = secret_param
    else:  # aws_secret_store=environment: readable in DescribeJobs (see the README)
        env.update(spec.secret_env)
    for name in env:
        if name.startswith("AWS_BATCH"):
            raise AwsOptionError(f"environment variable {name}: names starting with AWS_BATCH are reserved by Batch")
    overrides: dict[str, Any] = {
        "command": command,
        "environment": [{"name": k, "value": str(v)} for k, v in sorted(env.items())],
    }
    requirements = resources(spec.cpu, spec.memory, spec.gpu)
    if requirements:
        overrides["resourceRequirements"] = requirements
    tags = dict(parse_pairs(cfg.get("aws_tags"), "aws_tags"))
    tags.update(spec.labels or {})
    return {
        "jobName": job_name(session, spec.name),
        "jobQueue": queue,
        "jobDefinition": definition,
        "containerOverrides": overrides,
        "tags": tags,
        "propagateTags": True,
    }
