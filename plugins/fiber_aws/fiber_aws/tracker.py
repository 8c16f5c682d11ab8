"""Follows every Batch job of this process with batched DescribeJobs calls.

One thread; every ``aws_poll_interval`` seconds it describes the jobs that have not
finished, 100 per call (Batch's maximum), so 400 workers cost 4 calls a poll, never
one per job. Throttling (after botocore's own retries) doubles the interval, up to
30 s, until a poll succeeds. ``wait`` and ``status`` read what the last poll saw.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from fibercore.backendkit import signal_exit_code

log = logging.getLogger("fiber_aws")

BATCH_SIZE = 100
FINAL = ("SUCCEEDED", "FAILED")
MAX_INTERVAL = 30.0


class BatchJob:
    """What the tracker knows about one submitted job."""

    def __init__(self, job_id: str, name: str) -> None:
        self.job_id = job_id
        self.name = name
        self.status = "SUBMITTED"
        self.reason: str | None = None
        self.container_exit: int | None = None
        self.log_stream: str | None = None
        self.terminated: bool | None = None  # None: not by us; False: terminate(); True: kill()
        self.exitcode: int | None = None
        self.missing = False  # DescribeJobs stopped returning it
        self.done = threading.Event()

    def update(self, described: dict[str, Any]) -> None:
        self.status = described.get("status", self.status)
        self.reason = described.get("statusReason", self.reason)
        container = described.get("container") or {}
        attempts = described.get("attempts") or []
        last = (attempts[-1].get("container") or {}) if attempts else {}
        code = container.get("exitCode", last.get("exitCode"))
        if code is not None:
            self.container_exit = int(code)
        self.log_stream = container.get("logStreamName") or last.get("logStreamName") or self.log_stream


def exit_code(job: BatchJob) -> int:
    """The job's exit code in multiprocessing's convention, from what Batch said and what we did."""
    if job.container_exit is not None:
        return signal_exit_code(job.container_exit)
    if job.terminated is not None:  # stopped by us before or without a container exit code
        return -9 if job.terminated else -15
    return 0 if job.status == "SUCCEEDED" else 1


class Tracker:
    def __init__(self, describe: Callable[[list[str]], list[dict[str, Any]]], interval: float,
                 find_exit: Callable[[BatchJob], int | None] | None = None) -> None:
        self._describe = describe
        self._find_exit = find_exit
        self.interval = max(0.05, interval)
        self.jobs: dict[str, BatchJob] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self.calls = 0
        self._thread = threading.Thread(target=self._run, name="fiber-aws-tracker", daemon=True)
        self._thread.start()

    def add(self, job: BatchJob) -> None:
        with self._lock:
            self.jobs[job.job_id] = job

    def active(self) -> list[BatchJob]:
        with self._lock:
            return [j for j in self.jobs.values() if not j.done.is_set()]

    def poke(self) -> None:
        """Poll now (after a terminate, say) instead of at the next interval."""
        self._wake.set()

    def poll_once(self) -> None:
        active = self.active()
        for start in range(0, len(active), BATCH_SIZE):
            chunk = active[start:start + BATCH_SIZE]
            self.calls += 1
            seen = {d["jobId"]: d for d in self._describe([j.job_id for j in chunk])}
            for job in chunk:
                described = seen.get(job.job_id)
                if described is None:
                    job.missing = True
                    self._finish(job)
                    continue
                job.update(described)
                if job.status in FINAL:
                    self._finish(job)

    def _finish(self, job: BatchJob) -> None:
        if job.container_exit is None and job.status == "FAILED" and job.terminated is None and self._find_exit:
            try:
                found = self._find_exit(job)
            except Exception:
                found = None
            if found is not None:
                job.container_exit = found
        job.exitcode = exit_code(job)
        job.done.set()

    def _run(self) -> None:
        interval = self.interval
        while True:
            self._wake.wait(interval)
            self._wake.clear()
            if not self.active():
                interval = self.interval
                continue
            try:
                self.poll_once()
                interval = self.interval
            except Exception as exc:  # throttled or unreachable: slow down, keep going
                interval = min(MAX_INTERVAL, interval * 2)
                log.warning("fiber-aws: DescribeJobs failed (%s); next poll in %.1f s", exc, interval)

    def wait(self, job: BatchJob, timeout: float | None) -> int | None:
        if not job.done.wait(timeout):
            return None
        return job.exitcode
