"""Fixtures for the AWS Batch backend's tests: moto's server over HTTP, real containers.

- ``moto_url``: ``moto_server`` started on 127.0.0.1 (a free port) as a separate
  process with ``MOTO_DOCKER_NETWORK_MODE=host``, so that the containers moto's Batch
  runs for each job reach the master on 127.0.0.1; stopped by its PID.
- ``batch_env``: an IAM role, an UNMANAGED compute environment and a job queue on it.
- ``aws_config``: the fibercore config for that queue, with the worker image of this
  checkout (built by fiber_docker.testing, as for the docker tests).
- At the end of the session no job of this test run may be active on the server.

Without dockerd or moto the tests skip with the reason, except under ``CI=true``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aws_helpers import ACTIVE, CHECKOUT, CREDENTIALS, QUEUE, REGION, RUN_ID, client
from fiber_docker.testing import skip_or_fail


@pytest.fixture(scope="session", autouse=True)
def _aws_credentials() -> Iterator[None]:
    """Dummy credentials for boto3 in this process (moto accepts any)."""
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_url(tmp_path_factory: Any) -> Iterator[str]:
    try:
        import moto  # noqa: F401
    except ImportError:
        skip_or_fail("moto is not installed (pip install 'moto[server,batch]')", "aws")
    from fiber_docker.testing import docker_problem

    problem = docker_problem()
    if problem:
        skip_or_fail(f"moto's Batch runs jobs as containers: {problem}", "aws")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    env = {**os.environ, **CREDENTIALS, "MOTO_DOCKER_NETWORK_MODE": "host", "MOTO_PORT": str(port)}
    server = Path(sys.executable).with_name("moto_server")
    command = [str(server)] if server.exists() else [sys.executable, "-m", "moto.server"]
    with open(log, "wb") as out:
        proc = subprocess.Popen([*command, "-H", "127.0.0.1", "-p", str(port)], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/moto-api/", timeout=1).close()
            break
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.fail(f"moto_server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
    yield url
    proc.terminate()  # by its PID
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def batch_env(moto_url: str) -> Iterator[dict[str, str]]:
    iam, batch = client(moto_url, "iam"), client(moto_url, "batch")
    role = iam.create_role(RoleName="fiber-test-batch", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    ce = batch.create_compute_environment(computeEnvironmentName="fiber-test-ce", type="UNMANAGED",
                                          state="ENABLED", serviceRole=role)
    batch.create_job_queue(jobQueueName=QUEUE, state="ENABLED", priority=1,
                           computeEnvironmentOrder=[{"order": 1, "computeEnvironment": ce["computeEnvironmentArn"]}])
    yield {"queue": QUEUE, "role": role}
    left = [j for status in ACTIVE for j in batch.list_jobs(jobQueue=QUEUE, jobStatus=status)["jobSummaryList"]]
    deadline = time.monotonic() + 30
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = [j for status in ACTIVE for j in batch.list_jobs(jobQueue=QUEUE, jobStatus=status)["jobSummaryList"]]
    assert not left, f"Batch jobs still active on the moto server after the tests: {[j['jobName'] for j in left]}"


@pytest.fixture(scope="session")
def worker_image(moto_url: str) -> str:
    from fiber_docker.testing import test_image

    return test_image(CHECKOUT)


@pytest.fixture
def aws_config(moto_url: str, batch_env: dict[str, str], worker_image: str) -> dict[str, Any]:
    """fibercore config for the moto queue; jobs get dummy credentials for moto's SSM."""
    return {
        "image": worker_image,
        "aws_endpoint_url": moto_url,
        "aws_region": REGION,
        "aws_job_queue": batch_env["queue"],
        "aws_environment": ",".join(f"{k}={v}" for k, v in CREDENTIALS.items()),
        "aws_tags": f"fiber-test-run={RUN_ID}",
        "aws_poll_interval": 0.25,
        "listen_host": "127.0.0.1",  # the jobs share the host's network (MOTO_DOCKER_NETWORK_MODE=host)
        "aws_job_listen_host": "127.0.0.1",
    }
