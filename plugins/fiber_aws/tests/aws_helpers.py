"""Constants and helpers of the aws tests (conftest.py names clash across test folders)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[2]
RUN_ID = uuid.uuid4().hex[:12]
REGION = "us-east-1"
QUEUE = "fiber-test-queue"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
ACTIVE = ("SUBMITTED", "PENDING", "RUNNABLE", "STARTING", "RUNNING")


def client(moto_url: str, service: str) -> Any:
    """A boto3 client for moto's server."""
    import boto3

    return boto3.client(service, endpoint_url=moto_url, region_name=REGION,
                        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
