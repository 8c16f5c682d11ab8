"""The session secret in SSM Parameter Store, so that DescribeJobs never shows it.

The master stores it as a SecureString ``<aws_ssm_prefix>/<session>/secret`` (tagged
with the session); each job gets only the parameter's *name* and reads it at start-up
with its job role (``fiber_job_secret``). The master deletes it at exit; ``fiber
cleanup`` deletes those a crashed master left.
"""

from __future__ import annotations

from typing import Any

from fiber_aws.clients import reraise


def parameter_name(prefix: str, session: str) -> str:
    return f"{prefix.rstrip('/')}/{session}/secret"


def store(ssm: Any, name: str, secret_hex: str, session: str, kms_key: str | None) -> None:
    request: dict[str, Any] = {
        "Name": name, "Value": secret_hex, "Type": "SecureString",
        "Description": "fibercore session secret (deleted when the session ends)",
        "Tags": [{"Key": "fiber-session", "Value": session}],
    }
    if kms_key:
        request["KeyId"] = kms_key
    try:
        ssm.put_parameter(**request)
    except Exception as exc:
        reraise(exc, f"storing the session secret in SSM parameter {name} (aws_secret_store=ssm)")


def fetch(ssm: Any, name: str) -> str:
    try:
        return str(ssm.get_parameter(Name=name, WithDecryption=True)["Parameter"]["Value"])
    except Exception as exc:
        reraise(exc, f"reading the session secret from SSM parameter {name} (the job role needs "
                     "ssm:GetParameter on it, and kms:Decrypt for a customer key)")


def delete(ssm: Any, name: str) -> None:
    try:
        ssm.delete_parameter(Name=name)
    except Exception:
        pass


def delete_session(ssm: Any, prefix: str, session: str | None) -> int:
    """Delete the secret parameters of ``session`` (every session when None)."""
    path = prefix.rstrip("/") + (f"/{session}" if session else "")
    names = []
    paginator = ssm.get_paginator("get_parameters_by_path")
    for page in paginator.paginate(Path=path, Recursive=True):
        names += [p["Name"] for p in page.get("Parameters", [])]
    for name in names:
        delete(ssm, name)
    return len(names)
