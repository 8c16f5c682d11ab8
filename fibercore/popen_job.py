"""The seam between a Process and a backend: a Popen whose process is a job.

Like CPython's ``popen_spawn_posix``, but instead of forking it asks the selected
backend (``fiber_create_job``) for a job running ``python -m fibercore.worker``,
then waits for that job to connect back to this process's admin hub.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from fibercore import admin, dashboard
from fibercore.backendkit import MASTER_LABEL, master_label
from fibercore.errors import BackendUnavailableError, JobStartError, ProcessError
from fibercore.meta import get_meta
from fibercore.runtime import get_runtime
from fibercore.serialization import describe, dumps_or_explain
from fibercore.types import Job, JobSpec, JobStatus
from fibercore.util import debug_enabled, log_tail

if TYPE_CHECKING:
    from fibercore.process import Process


#: The exit status of a job declared lost by the heartbeat (as a killed job's).
LOST = -9
#: Seconds between checks for a lost job while a remote job is waited for.
LOST_CHECK = 0.5

_master_labels: dict[int, str] = {}  # by pid: a forked copy of the master is another process


def _master_label() -> str:
    """:func:`fibercore.backendkit.master_label` of this process (read once per process)."""
    pid = os.getpid()
    return _master_labels.get(pid) or _master_labels.setdefault(pid, master_label())



def _serialize_process(process: Process) -> list[Any]:
    """Pickle the process for the job, naming the culprit when something cannot go."""
    rt = get_runtime()
    try:
        return rt.serializer.dumps(process)
    except Exception:
        pass
    candidates = [("target", process._target)]
    candidates += [(f"argument {i}", a) for i, a in enumerate(process._args)]
    candidates += [(f"keyword argument {k!r}", v) for k, v in process._kwargs.items()]
    candidates += [(f"attribute {k!r} of {type(process).__name__}", v) for k, v in vars(process).items()
                   if not k.startswith("_")]
    for what, obj in candidates:
        dumps_or_explain(rt.serializer, obj, f"the {what} of {process.name}")
    return dumps_or_explain(rt.serializer, process, f"process {process.name} ({describe(process)})")


class JobPopen:
    """Starts one job for a Process and answers poll/wait/terminate for it."""

    def __init__(self, process: Process) -> None:
        # From its first job on, fiber top finds the program (and the dashboard, when asked
        # for, is up before that job runs).
        dashboard.master_started()
        rt = get_runtime()
        self._rt = rt
        self.returncode: int | None = None
        self._sentinel_r: int | None = None
        self._sentinel_lock = threading.Lock()
        self._lost_lock = threading.Lock()
        hub = self._hub = admin.get_hub()
        prep = {
            "sys_path": list(sys.path),
            "cwd": os.getcwd(),
            "parent_pid": os.getpid(),
            "parent_name": process._parent_name,
            "name": process.name,
            "parent_host": socket.gethostname(),
            "argv": list(sys.argv),  # as multiprocessing's spawn: the child sees the parent's argv
        }
        payload = [pickle.dumps(prep, protocol=5), *_serialize_process(process)]
        self._launch = hub.register(payload)
        cfg = rt.config
        meta = get_meta(process)
        spec = JobSpec(
            args=["-m", "fibercore.worker"],
            python=cfg.get("python_exe") or None,
            session=rt.session,
            env={
                "FIBER_MASTER_ADDR": hub.address,
                "FIBER_TOKEN": self._launch.token,
                "FIBER_SESSION": rt.session,
                **cfg.to_env(),
                "FIBER_BACKEND": rt.backend,
                "FIBER_PLUGIN_MODULES": ",".join(rt.plugins.modules),
                "FIBER_MASTER_PYTHON": "{}.{}".format(*sys.version_info[:2]),
            },
            secret_env={"FIBER_SECRET": rt.secret.hex()},
            name=process.name,
            image=cfg.get("image") or cfg.get("default_image"),
            cpu=meta.get("cpu", cfg.get("cpu_per_job")),
            memory=meta.get("memory", cfg.get("mem_per_job")),
            gpu=meta.get("gpu", cfg.get("gpu_per_job")),
            labels={"fiber-session": rt.session, "fiber-process": process.name, MASTER_LABEL: _master_label()},
            cwd=os.getcwd(),
        )
        self.spec = spec
        try:
            self.job: Job = rt.plugins.create_job(spec)
        except BackendUnavailableError as exc:
            hub.forget(self._launch)
            # The backend's own message names the fix; the chain below it (HTTP client
            # retries) is for FIBER_DEBUG=1 only.
            raise BackendUnavailableError(
                f"backend {rt.backend!r} cannot start jobs: {exc}") from (exc if debug_enabled() else None)
        except ProcessError:
            hub.forget(self._launch)
            raise
        except Exception as exc:
            hub.forget(self._launch)
            raise ProcessError(
                f"backend {rt.backend!r} could not start {process.name}: {type(exc).__name__}: {exc}"
            ) from exc
        self.pid = self.job.pid

    # -- start-up ---------------------------------------------------------------------
    def wait_started(self, timeout: float | None = None) -> None:
        """Block until the job's worker connected, or raise JobStartError with its logs."""
        rt = self._rt
        if timeout is None:
            timeout = float(rt.config.get("start_timeout"))
        deadline = time.monotonic() + timeout
        launch = self._launch
        next_status = time.monotonic() + 0.2
        while not launch.connected.wait(0.02):
            now = time.monotonic()
            if now >= next_status:
                next_status = now + 0.5
                status = rt.plugins.job_status(self.job)
                if status is JobStatus.EXITED:
                    code = rt.plugins.wait_job(self.job, 1.0)
                    if launch.connected.is_set():
                        break
                    self._record_exit(code)
                    self._start_failed(f"its job exited with code {code} before connecting", status)
            if now >= deadline:
                status = rt.plugins.job_status(self.job)
                rt.plugins.terminate_job(self.job, True)
                self._start_failed(
                    f"its job did not connect back within {timeout:.0f} s (start_timeout)", status
                )
        if self.pid is None:
            self.pid = launch.remote_pid

    def _start_failed(self, what: str, status: JobStatus) -> None:
        raise self.start_error(what, status)

    def start_error(self, what: str, status: JobStatus) -> JobStartError:
        """The error for a job that never connected: what happened, the job, its logs."""
        rt = self._rt
        self._hub.forget(self._launch)
        logs = rt.plugins.job_logs(self.job)
        return JobStartError(
            f"{self.spec.name} failed to start on backend {rt.backend!r}: {what}.\n"
            f"  job: {self.job.jid} (status {status.value}), session {rt.session} "
            f"(`fiber cleanup --session {rt.session}` stops its jobs)\n"
            f"  command: {' '.join(self.job.command or self.spec.argv('python'))}\n"
            f"  likely causes: the worker's Python cannot import fibercore (image or "
            f"python_exe), the job cannot reach {self._hub.address} (listen_host), or the "
            f"backend has no capacity (a pending pod, a full queue).\n"
            f"  job logs:\n{log_tail(logs)}",
            status=status,
            logs=logs,
        )

    @property
    def connected(self) -> bool:
        """Whether the job's worker has connected back (and so watches this process)."""
        return self._launch.connected.is_set()

    # -- the multiprocessing Popen interface ------------------------------------------
    def _record_exit(self, code: int | None) -> None:
        if code is not None and self.returncode is None:
            reported = self._launch.reported_exit
            if reported is not None and code >= 0:
                # The worker said how it ended: exact even where a backend can only
                # tell "128 + N" (containers) or nothing precise (a cluster API).
                code = reported
            self.returncode = code
            self._rt.plugins.job_exited(self.job, code)
            self._hub.forget(self._launch)

    @property
    def where(self) -> tuple[str, int, str] | None:
        """(host name, pid, machine identity or "") of the job's worker as it introduced
        itself; None before it connected."""
        launch = self._launch
        if launch.remote_host is None or launch.remote_pid is None:
            return None
        return launch.remote_host, launch.remote_pid, launch.remote_machine

    @property
    def lost(self) -> str | None:
        """Why the admin hub declared this job lost (silent past ``heartbeat_timeout``), or None."""
        return self._launch.lost

    def _lost_exit(self) -> bool:
        """A job declared lost ends now, for this process, with -9 (as a killed job): its
        backend is told to kill it in the background (its host may not answer), and the
        job ends itself on its side within the same bound. True once the job has ended."""
        if self.returncode is not None:
            return True
        if self._launch.lost is None:
            return False
        with self._lost_lock:  # the pool's supervisor and a user's join() may both get here
            if self.returncode is not None:
                return True
            self._record_exit(LOST)
        try:
            threading.Thread(target=self._kill_quietly, name=f"fiber-kill-{self.job.jid}", daemon=True).start()
        except RuntimeError:  # the interpreter is shutting down: no new threads
            self._kill_quietly()
        return True

    def _kill_quietly(self) -> None:
        try:
            self._rt.plugins.terminate_job(self.job, True)
        except Exception:
            pass

    def poll(self, flag: int = os.WNOHANG) -> int | None:
        if not self._lost_exit():
            self._record_exit(self._rt.plugins.wait_job(self.job, 0 if flag else None))
        return self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self._lost_exit():
            return self.returncode
        launch = self._launch
        if not launch.watched:  # no heartbeat to watch: the backend alone says when it ends
            self._record_exit(self._rt.plugins.wait_job(self.job, timeout))
            return self.returncode
        # A remote job may be declared lost while waited for: wait in slices of its heartbeat
        # (at least one, so that wait(0) reaps a job that has ended).
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            step = LOST_CHECK if deadline is None else min(max(0.0, deadline - time.monotonic()), LOST_CHECK)
            self._record_exit(self._rt.plugins.wait_job(self.job, step))
            if self._lost_exit() or (deadline is not None and time.monotonic() >= deadline):
                return self.returncode

    def terminate(self) -> None:
        if self.returncode is None:
            self._rt.plugins.terminate_job(self.job, False)

    def kill(self) -> None:
        if self.returncode is None:
            self._rt.plugins.terminate_job(self.job, True)

    @property
    def sentinel(self) -> int:
        """A file descriptor that becomes readable when the job ends (for select/wait)."""
        with self._sentinel_lock:
            if self._sentinel_r is None:
                r, w = os.pipe()
                self._sentinel_r = r

                def watch() -> None:
                    self.wait(None)
                    os.close(w)

                threading.Thread(target=watch, name=f"fiber-sentinel-{self.job.jid}", daemon=True).start()
            return self._sentinel_r

    def close(self) -> None:
        if self._sentinel_r is not None:
            try:
                os.close(self._sentinel_r)
            except OSError:
                pass
            self._sentinel_r = None
