"""fiber-aws runs fibercore's backend conformance suite against moto's Batch, whose jobs
are real containers on the local dockerd."""

from typing import Any

import pytest
from aws_helpers import client

import fibercore as fc
from fibercore.testing import BackendConformance

REASON = "test: TerminateJob mid-map"


class TestAwsBatchBackend(BackendConformance):
    backend = "aws"
    terminate_exitcode = -15  # TerminateJob by terminate(): reported as SIGTERM, as multiprocessing does
    broken_python_exe = "/bin/false"  # exists in the image, is no Python
    timeout = 90.0
    logs_from_elsewhere = "after_exit"  # moto writes a Batch job's log stream when its container ends

    @pytest.fixture
    def backend_config(self, aws_config: dict[str, Any], moto_url: str) -> dict[str, Any]:
        self.batch = client(moto_url, "batch")
        return dict(aws_config)

    def _describe(self, job_id: str) -> dict[str, Any]:
        return self.batch.describe_jobs(jobs=[job_id])["jobs"][0]

    def kill_outside_fibercore(self, process: fc.Process) -> None:
        """TerminateJob through Batch's API, as an operator or a spot reclaim would."""
        assert self._describe(process.job.jid)["status"] == "RUNNING"
        self.batch.terminate_job(jobId=process.job.jid, reason=REASON)

    def check_replaced_outside(self, victim: fc.Process, workers: list[fc.Process]) -> None:
        described = self._describe(victim.job.jid)
        assert described["status"] == "FAILED" and described["statusReason"] == REASON
        assert {self._describe(w.job.jid)["status"] for w in workers} == {"RUNNING"}
