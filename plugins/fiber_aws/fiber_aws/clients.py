"""boto3 clients for Batch, CloudWatch Logs and SSM, and errors explained in one line.

Retries: botocore's retry modes (``aws_retry_mode``, default ``adaptive``: client-side
rate limiting plus exponential backoff on throttling and transient errors) with
``aws_max_attempts`` attempts per call; SubmitJob gets a bounded extra backoff in
:func:`call_with_backoff` because a Pool submits many jobs at once.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from fibercore.errors import BackendUnavailableError

if TYPE_CHECKING:
    from fibercore.types import ConfigView

#: Error codes worth another try after a pause (throttling, AWS-side hiccups).
RETRYABLE = frozenset({
    "TooManyRequestsException", "ThrottlingException", "Throttling", "ThrottledException",
    "RequestLimitExceeded", "ServerException", "ServiceUnavailable", "ServiceUnavailableException",
    "InternalFailure", "InternalServerError",
})


class AwsSetupError(RuntimeError, BackendUnavailableError):
    """AWS cannot be used as configured; the message says which setting to fix."""


def error_code(exc: BaseException) -> str | None:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        return (response.get("Error") or {}).get("Code")
    return None


def explain(exc: BaseException, doing: str) -> BaseException:
    """One line saying what went wrong ``doing`` what, and what to set; else ``exc``."""
    import botocore.exceptions as be

    if isinstance(exc, be.NoRegionError):
        return AwsSetupError(f"{doing}: no AWS region; set aws_region (FIBER_AWS_REGION) or AWS_DEFAULT_REGION")
    if isinstance(exc, (be.NoCredentialsError, be.PartialCredentialsError)):
        return AwsSetupError(
            f"{doing}: no AWS credentials; set aws_profile (FIBER_AWS_PROFILE), AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or run where a role provides them"
        )
    if isinstance(exc, be.ProfileNotFound):
        return AwsSetupError(f"{doing}: {exc}; check aws_profile (FIBER_AWS_PROFILE) against ~/.aws/config")
    if isinstance(exc, be.EndpointConnectionError):
        return AwsSetupError(f"{doing}: cannot connect to {exc.kwargs.get('endpoint_url')}; check aws_endpoint_url "
                             "and aws_region")
    code = error_code(exc)
    if code in ("UnrecognizedClientException", "InvalidClientTokenId", "InvalidSignatureException",
                "SignatureDoesNotMatch"):
        return AwsSetupError(f"{doing}: AWS rejected the credentials ({code}); check aws_profile or AWS_ACCESS_KEY_ID")
    if code in ("ExpiredToken", "ExpiredTokenException", "RequestExpired"):
        return AwsSetupError(f"{doing}: the AWS session token expired ({code}); refresh your credentials")
    if code and ("AccessDenied" in code or code == "UnauthorizedOperation"):
        return AwsSetupError(f"{doing}: access denied ({code}): {exc}; the IAM policy in the fiber-aws README lists "
                             "the actions fibercore needs")
    if code == "ClientException":
        return AwsSetupError(f"{doing}: AWS Batch refused the request: {exc}")
    return exc


def reraise(exc: BaseException, doing: str) -> NoReturn:
    """Raise the explained error (chained), or ``exc`` itself when there is nothing to add."""
    err = explain(exc, doing)
    if err is exc:
        raise exc
    raise err from exc


class Clients:
    """The session and the three clients one master (or job) uses, made on first use."""

    def __init__(self, cfg: ConfigView) -> None:
        self._cfg = cfg
        self._clients: dict[str, Any] = {}

    def __call__(self, service: str) -> Any:
        client = self._clients.get(service)
        if client is None:
            import boto3
            from botocore.config import Config

            cfg = self._cfg
            try:
                session = boto3.session.Session(profile_name=cfg.get("aws_profile") or None,
                                                region_name=cfg.get("aws_region") or None)
                client = session.client(
                    service,
                    endpoint_url=cfg.get("aws_endpoint_url") or None,
                    config=Config(
                        retries={"mode": cfg.get("aws_retry_mode") or "adaptive",
                                 "max_attempts": int(cfg.get("aws_max_attempts") or 10)},
                        user_agent_extra="fibercore",
                        max_pool_connections=32,
                    ),
                )
            except Exception as exc:
                reraise(exc, f"creating the AWS {service} client")
            self._clients[service] = client
        return client


def call_with_backoff(fn: Callable[[], Any], attempts: int, doing: str,
                      sleep: Callable[[float], None] = time.sleep) -> Any:
    """``fn()``, retried after throttling or transient errors at most ``attempts`` times
    with jittered exponential backoff (0.5 s doubling, at most 8 s a pause)."""
    for attempt in range(attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if error_code(exc) not in RETRYABLE or attempt == attempts:
                reraise(exc, doing)
            sleep(min(8.0, 0.5 * 2 ** attempt) * (0.5 + random.random() / 2))
    raise AssertionError("unreachable")
