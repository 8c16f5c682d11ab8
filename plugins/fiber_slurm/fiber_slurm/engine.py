"""Slurm through its command-line tools: ``sbatch`` submits, one ``squeue`` per poll tracks
every job of this process, ``scontrol`` reads a finished job's exit code, ``scancel`` stops.

Why the commands and not slurmrestd: every Slurm site has them, with the user's own
credentials (munge); slurmrestd needs JWT set-up that many sites do not enable.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from fibercore.backendkit import MASTER_LABEL, PROCESS_LABEL, SecretFiles, clean_session, sessions_to_clean
from fibercore.errors import ProcessError

if TYPE_CHECKING:
    from fibercore.types import Check, ConfigView, Job, JobInfo, JobSpec, JobStatus

NAME = "slurm"

ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING",
          "STAGE_OUT", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "STOPPED"}


def private_spool(configured: str | None) -> str:
    """The directory job output and secret files go to, readable by this user only.

    ``slurm_spool_dir`` itself when it is this user's and closed to others (made 0700 if
    missing); inside a shared one (mode 0777, /scratch...), a private ``fibercore-<uid>``
    directory, which must then be this user's and 0700.
    """
    spool = os.path.abspath(os.path.expanduser(configured or "~/.fibercore/slurm"))
    os.makedirs(spool, mode=0o700, exist_ok=True)
    st = os.stat(spool)
    if st.st_uid == os.geteuid() and not st.st_mode & 0o077:
        return spool
    private = os.path.join(spool, f"fibercore-{os.geteuid()}")
    try:
        os.mkdir(private, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(private)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SlurmError(f"{private} (inside the shared slurm_spool_dir {spool}) is not a directory of yours "
                         f"with mode 0700: remove it, or set slurm_spool_dir to a private directory every node mounts")
    return private


class SlurmError(ProcessError):
    """A Slurm command failed; the message has its output (Slurm's reason)."""


def run(argv: list[str], *, input_text: str | None = None, env: dict[str, str] | None = None,
        timeout: float = 60) -> str:
    try:
        done = subprocess.run(argv, input=input_text, env=env, capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} is not installed here: fiber-slurm needs Slurm's client commands "
                         "(apt-get install slurm-client, or load your site's slurm module)") from None
    if done.returncode != 0:
        raise SlurmError(f"{shlex.join(argv[:2])}... failed (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()}")
    return done.stdout


class SlurmJob:
    """What the engine knows about one job it submitted."""

    def __init__(self, job_id: str, name: str, output: str) -> None:
        self.job_id = job_id
        self.name = name
        self.output = output
        self.state = "PENDING"
        self.reason = ""  # squeue's %r: why it is still pending (Resources, Priority, ...)
        self.exitcode: int | None = None
        self.terminated: bool | None = None  # None: not by us; False: terminate(); True: kill()
        self.done = threading.Event()
        self.engine: Any = None  # the Engine that submitted it


def exit_code_of(text: str, terminated: bool | None, state: str) -> int:
    """``scontrol show job`` output -> a multiprocessing exit code (negative signal)."""
    found = re.search(r"\bExitCode=(\d+):(\d+)", text)
    code, sig = (int(found.group(1)), int(found.group(2))) if found else (0, 0)
    if sig:
        return -sig
    if state == "CANCELLED" and terminated is not None:
        return -9 if terminated else -15
    if code > 128 and state == "CANCELLED":
        return -(code - 128)
    return code if state != "CANCELLED" or code else -15


def sbatch_options(spec: JobSpec, config: ConfigView) -> list[str]:
    """Resources and site options as sbatch arguments."""
    out = []
    if spec.cpu:
        out.append(f"--cpus-per-task={max(1, math.ceil(spec.cpu))}")
    if spec.memory:
        out.append(f"--mem={int(spec.memory)}M")
    if spec.gpu:
        out.append(f"--gres=gpu:{int(spec.gpu)}")
    for key, flag in (("slurm_partition", "--partition"), ("slurm_account", "--account"),
                      ("slurm_qos", "--qos"), ("slurm_time", "--time")):
        if config.get(key):
            out.append(f"{flag}={config.get(key)}")
    out += shlex.split(config.get("slurm_extra") or "")
    return out


class Engine:
    """One per configuration: submits, polls all jobs in one squeue call, cancels."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.jobs: dict[str, SlurmJob] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closing = False
        self.spool = private_spool(cfg.get("slurm_spool_dir"))
        self.secrets = SecretFiles(self.spool)
        threading.Thread(target=self._poll, name="fiber-slurm-poll", daemon=True).start()

    # -- submit ---------------------------------------------------------------------------
    def create(self, spec: JobSpec, config: ConfigView) -> Job:
        """``sbatch`` a two-line script that execs the worker; its environment is exported by
        sbatch itself (never on a command line), the session secret is a 0600 file."""
        from fibercore.types import Job

        # Not this process's own allocation (SLURM_JOB_ID...), but the client's configuration.
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        env.update(spec.env)
        secret_hex = spec.secret_env.get("FIBER_SECRET")
        if secret_hex:
            env["FIBER_SECRET_FILE"] = self.secrets.path(spec.session, secret_hex)
        env.pop("FIBER_SECRET", None)
        argv = spec.argv(sys.executable)
        name = f"fiber-{spec.session}-{spec.name}"
        options = sbatch_options(spec, config)
        master = spec.labels.get(MASTER_LABEL)
        if master:  # who started it, for fiber cleanup (squeue shows a job's comment); first, so
            options.insert(0, f"--comment={master}")  # that a --comment in slurm_extra wins
        job = self.submit(name, argv, env, options, spec.cwd)
        return Job(jid=job.job_id, backend=NAME, data=job, spec=spec, command=argv)

    def status(self, job: SlurmJob) -> JobStatus:
        from fibercore.types import JobStatus

        if job.done.is_set():
            return JobStatus.EXITED
        return JobStatus.RUNNING if job.state == "RUNNING" else JobStatus.PENDING

    def submit(self, name: str, argv: list[str], env: dict[str, str], options: list[str], cwd: str | None) -> SlurmJob:
        output = os.path.join(self.spool, f"{name}-%j.out")
        script = "#!/bin/sh\nexec " + shlex.join(argv) + "\n"
        command = ["sbatch", "--parsable", f"--job-name={name}", f"--output={output}", f"--error={output}",
                   "--export=ALL", *options]
        if cwd:
            command.append(f"--chdir={cwd}")
        job_id = run(command, input_text=script, env=env).strip().split(";")[0]
        job = SlurmJob(job_id, name, output.replace("%j", job_id))
        job.engine = self
        with self.lock:
            self.jobs[job_id] = job
        self.wake.set()
        return job

    # -- track ----------------------------------------------------------------------------
    def _poll(self) -> None:
        interval = float(self.cfg.get("slurm_poll_interval") or 0.5)
        while not self.closing:
            self.wake.wait(interval)
            self.wake.clear()
            with self.lock:
                ids = [j.job_id for j in self.jobs.values() if not j.done.is_set()]
            if not ids:
                continue
            try:
                text = run(["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", "%i|%T|%r"])
            except SlurmError:
                continue  # a transient controller hiccup: next poll
            rows = {row[0]: row for row in (line.split("|", 2) for line in text.splitlines()) if len(row) == 3}
            for job_id in ids:
                job = self.jobs[job_id]
                state = rows[job_id][1] if job_id in rows else None
                if state is None:
                    # Gone from squeue (older than MinJobAge): ask scontrol once, else lost.
                    self._finish(job, "UNKNOWN")
                    continue
                job.state = state
                job.reason = rows[job_id][2]
                if state not in ACTIVE:
                    self._finish(job, state)

    def _finish(self, job: SlurmJob, state: str) -> None:
        try:
            text = run(["scontrol", "show", "job", "-o", job.job_id])
            found = re.search(r"\bJobState=(\w+)", text)
            state = found.group(1) if found else state
        except SlurmError:
            text = ""
        job.state = state
        job.exitcode = exit_code_of(text, job.terminated, state) if text else (-9 if job.terminated else 1)
        job.done.set()

    def wait(self, job: SlurmJob, timeout: float | None) -> int | None:
        if not job.done.wait(timeout):
            return None
        return job.exitcode

    def terminate(self, job: SlurmJob, force: bool) -> None:
        if job.done.is_set():
            return
        if job.terminated is None or force:
            job.terminated = force
        argv = ["scancel", job.job_id] if force else ["scancel", "--full", "--signal=TERM", job.job_id]
        try:
            run(argv)
        except SlurmError:
            pass  # finished meanwhile
        if not force:  # SIGTERM, then Slurm's own cancel after a grace, as docker stop does
            grace = float(self.cfg.get("slurm_kill_after") or 10)
            timer = threading.Timer(grace, lambda: None if job.done.is_set() else self.terminate(job, True))
            timer.daemon = True  # the master's exit (close() cancels every job) must not wait for it
            timer.start()
        self.wake.set()

    def logs(self, job: SlurmJob) -> str:
        try:
            with open(job.output, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 64 * 1024))
                return fh.read().decode("utf-8", "replace")
        except FileNotFoundError:
            why = f", reason {job.reason}" if job.reason and job.reason != "None" else ""
            return f"(Slurm job {job.job_id} has written no output yet; state {job.state}{why})"

    def follow(self, job: SlurmJob) -> Iterator[str]:
        """The job's output file as it grows, until the job has ended and the file is read."""
        offset = 0
        while True:
            finished = job.done.is_set()
            try:
                with open(job.output, "rb") as fh:
                    fh.seek(offset)
                    chunk = fh.read()
            except FileNotFoundError:
                chunk = b""
            if chunk:
                offset += len(chunk)
                yield chunk.decode("utf-8", "replace")
            elif finished:
                return
            else:
                time.sleep(0.2)

    # -- sessions ---------------------------------------------------------------------------
    def list_named(self, prefix: str, column: str = "%N") -> list[tuple[str, str, str, str]]:
        """(id, name, state, node) of this user's jobs whose name starts with ``prefix``;
        ``column``: another squeue field in the node's place (``%k``: the comment)."""
        text = run(["squeue", "-h", "-t", "all", "--me", "-o", f"%i|%T|{column}|%j"])
        out = []
        for line in text.splitlines():
            job_id, state, extra, name = line.split("|", 3)
            if name.startswith(prefix):
                out.append((job_id, name, state, extra))
        return out

    def show(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict ({} when Slurm no longer knows the job)."""
        try:
            text = run(["scontrol", "show", "job", "-o", job_id])
        except SlurmError:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def list_jobs(self, session: str | None) -> list[JobInfo]:
        """The jobs of ``session`` (any fiber session when None) as JobInfo records."""
        from fibercore.types import JobInfo, JobStatus

        out = []
        for job_id, name, state, node in self.list_named(f"fiber-{session}-" if session else "fiber-"):
            parts = name.split("-", 2)
            if len(parts) != 3:
                continue
            status = (JobStatus.RUNNING if state == "RUNNING" else JobStatus.PENDING if state in ACTIVE
                      else JobStatus.EXITED)
            code = None
            if status is JobStatus.EXITED:
                code = exit_code_of(" ".join(f"{k}={v}" for k, v in self.show(job_id).items()), None, state)
            out.append(JobInfo(jid=job_id, backend="slurm", session=parts[1], name=parts[2], status=status,
                               host=node or None, exitcode=code))
        return out

    def read_logs(self, job_id: str) -> str | None:
        """The output of fiber job ``job_id`` from any process (None: not a fiber job)."""
        if not job_id.isdigit():
            return None
        info = self.show(job_id)
        if not info.get("JobName", "").startswith("fiber-"):
            return None
        path = info.get("StdOut", "")
        try:
            with open(path, "rb") as fh:
                return fh.read().decode("utf-8", "replace")
        except OSError as exc:
            raise SlurmError(f"the output of Slurm job {job_id} ({path}) cannot be read here: {exc}; "
                             "fiber logs must run on a node that sees slurm_spool_dir") from None

    def cleanup(self, session: str | None) -> int:
        """Cancel the jobs of ``session``; None: of every session whose master is gone
        (:func:`fibercore.backendkit.sessions_to_clean`; a job's comment names its master)."""
        if session is not None:
            return self._cleanup_session(session)
        jobs = [(name.split("-")[1], {MASTER_LABEL: comment if comment != "(null)" else "",
                                      PROCESS_LABEL: "master" if name.endswith("-master") else ""},
                 state in ACTIVE)
                for _, name, state, comment in self.list_named("fiber-", "%k") if name.count("-") >= 2]
        return sum(self._cleanup_session(s) for s in sessions_to_clean(jobs))

    def _cleanup_session(self, session: str) -> int:
        """Cancel the active jobs of ``session`` (its master first) and remove its secret files."""
        prefix = f"fiber-{session}-"

        def find() -> list[tuple[str, bool]]:
            return [(job_id, name.endswith("-master")) for job_id, name, state, _ in self.list_named(prefix)
                    if state in ACTIVE]

        count = clean_session(find, lambda ids: run(["scancel", *ids]), passes=1)
        self._forget_secrets(session)
        return count

    def _forget_secrets(self, session: str) -> None:
        """Remove the secret files of ``session`` that a master which died without closing left
        in the spool (this engine's own stay until :meth:`close`)."""
        if session in self.secrets.sessions:
            return
        for entry in os.listdir(self.spool):
            if SecretFiles.session_of(entry) == session:
                try:
                    os.unlink(os.path.join(self.spool, entry))
                except OSError:
                    pass

    def close(self) -> None:
        self.closing = True
        with self.lock:
            jobs = [j for j in self.jobs.values() if not j.done.is_set()]
        if jobs:
            try:
                run(["scancel", *[j.job_id for j in jobs]])
            except SlurmError:
                pass
        self.secrets.close()


def doctor(config: ConfigView) -> list[Check]:
    """The client commands, the controller and a partition, the spool directory."""
    from fibercore.types import Check

    checks = []
    try:
        version = run(["sbatch", "--version"], timeout=10).strip()
        checks.append(Check(NAME, "Slurm client commands", True, version))
    except SlurmError as exc:
        detail = str(exc).strip().splitlines()[-1]  # the command's last word (sbatch: fatal: ...)
        if shutil.which("sbatch") is None:
            fix = "install Slurm's client commands (apt-get install slurm-client) or load the site's slurm module"
        else:
            fix = ("sbatch is installed but finds no cluster: set SLURM_CONF to the cluster's slurm.conf, "
                   "or run on a node of the cluster (a login node)")
        return [Check(NAME, "Slurm client commands", False, detail, fix)]
    try:
        parts = run(["sinfo", "-h", "-o", "%P|%a|%D|%T"], timeout=10).split()
        usable = [p for p in parts if p.split("|")[1] == "up" and p.split("|")[3] not in ("down", "drained")]
        checks.append(Check(NAME, "slurmctld answers and a partition is up", bool(usable), " ".join(parts),
                            "ask the cluster's admins: no partition is up with usable nodes"))
    except SlurmError as exc:
        checks.append(Check(NAME, "slurmctld answers and a partition is up", False, str(exc),
                            "check SLURM_CONF and that slurmctld runs (scontrol ping)"))
    spool = config.get("slurm_spool_dir") or "~/.fibercore/slurm"
    try:
        spool = private_spool(spool)
        ok = os.access(spool, os.W_OK)
    except (OSError, SlurmError):
        ok = False
    checks.append(Check(NAME, "spool directory writable", ok, spool,
                        "set slurm_spool_dir to a directory on a file system every node mounts"))
    return checks
