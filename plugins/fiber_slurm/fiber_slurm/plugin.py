"""Slurm backend: every Fiber process is a Slurm job (``FIBER_BACKEND=slurm``; chosen
automatically inside an allocation, where ``SLURM_JOB_ID`` is set).

Each job is ``sbatch`` of a two-line script that execs ``python -m fibercore.worker`` (the
master's interpreter unless ``python_exe`` says otherwise: nodes share the file system),
with the environment exported by sbatch itself (never on a command line), the session
secret in a 0600 file on the shared spool, resources as ``--cpus-per-task``, ``--mem`` and
``--gres=gpu:N``, and partition, account, QoS, time limit and extra ``#SBATCH`` options from
the configuration. Written on fibercore's public names only, as a third party would.
"""

from __future__ import annotations

import atexit
import math
import os
import shlex
import shutil
import sys
import threading
from typing import Any

import pluggy

hookimpl = pluggy.HookimplMarker("fiber")

#: The fibercore hook contract these hooks are written for (fibercore.hookspecs).
FIBER_CONTRACT = 2
NAME = "slurm"

#: The engine of each configuration in use: ``fibercore.init(...)`` with other settings gets
#: its own, while jobs keep the engine that started them.
ENGINE_KEYS = ("slurm_spool_dir", "slurm_poll_interval", "slurm_kill_after")
_engines: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()


def engine(config: Any) -> Any:
    key = tuple(config.get(k) for k in ENGINE_KEYS)
    with _lock:
        eng = _engines.get(key)
        if eng is None:
            from fiber_slurm.engine import Engine

            eng = _engines[key] = Engine(config)
    return eng


@atexit.register
def _at_exit() -> None:
    for eng in list(_engines.values()):
        eng.close()


def _job(job: Any) -> Any:
    return job.data if getattr(job, "backend", None) == NAME else None


@hookimpl
def fiber_config_options() -> list[Any]:
    from fibercore.types import Option

    def opt(name: str, typ: Any, default: Any, text: str) -> Any:
        return Option(name, typ, default, text, plugin="fiber-slurm")

    return [
        opt("slurm_partition", str, None, "Partition of the jobs (sbatch --partition; default: the cluster's)."),
        opt("slurm_account", str, None, "Account the jobs are charged to (--account)."),
        opt("slurm_qos", str, None, "Quality of service (--qos)."),
        opt("slurm_time", str, None, "Time limit of each job (--time, e.g. 2:00:00)."),
        opt("slurm_extra", str, None, "Extra sbatch options, as on an #SBATCH line (e.g. --constraint=a100 "
                                      "--exclusive)."),
        opt("slurm_spool_dir", str, "~/.fibercore/slurm",
            "A directory every node sees (shared file system): job output files and the session secret (0600)."),
        opt("slurm_poll_interval", float, 0.5, "Seconds between squeue polls (one call for all jobs of the master)."),
        opt("slurm_kill_after", float, 10.0, "Seconds terminate() waits after SIGTERM before scancel kills the job."),
    ]


@hookimpl
def fiber_detect_backend() -> str | None:
    return NAME if os.environ.get("SLURM_JOB_ID") else None


@hookimpl
def fiber_listen_host(config: Any) -> str:
    from fibercore.backendkit import outward_address

    return outward_address()


def sbatch_options(spec: Any, config: Any) -> list[str]:
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


@hookimpl
def fiber_create_job(spec: Any, config: Any) -> Any:
    from fibercore.backendkit import MASTER_LABEL
    from fibercore.types import Job

    eng = engine(config)
    # Not this process's own allocation (SLURM_JOB_ID...), but the client's configuration.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env.update(spec.env)
    secret_hex = spec.secret_env.get("FIBER_SECRET")
    if secret_hex:
        env["FIBER_SECRET_FILE"] = eng.secret_file(spec.session, secret_hex)
    env.pop("FIBER_SECRET", None)
    argv = spec.argv(sys.executable)
    name = f"fiber-{spec.session}-{spec.name}"
    options = sbatch_options(spec, config)
    master = spec.labels.get(MASTER_LABEL)
    if master:  # who started it, for fiber cleanup (squeue shows a job's comment); first, so
        options.insert(0, f"--comment={master}")  # that a --comment in slurm_extra wins
    job = eng.submit(name, argv, env, options, spec.cwd)
    return Job(jid=job.job_id, backend=NAME, data=job, spec=spec, command=argv)


@hookimpl
def fiber_job_status(job: Any) -> Any:
    from fibercore.types import JobStatus

    j = _job(job)
    if j is None:
        return None
    if j.done.is_set():
        return JobStatus.EXITED
    return JobStatus.RUNNING if j.state == "RUNNING" else JobStatus.PENDING


@hookimpl
def fiber_wait_job(job: Any, timeout: float | None, config: Any) -> int | None:
    j = _job(job)
    return None if j is None else j.engine.wait(j, timeout)


@hookimpl
def fiber_terminate_job(job: Any, force: bool, config: Any) -> bool | None:
    j = _job(job)
    if j is None:
        return None
    j.engine.cancel(j, force)
    return True


@hookimpl
def fiber_job_logs(job: Any, config: Any) -> str | None:
    j = _job(job)
    return None if j is None else j.engine.logs(j)


@hookimpl
def fiber_cleanup_jobs(session: str | None, config: Any) -> int:
    return engine(config).cleanup(session)


@hookimpl
def fiber_list_jobs(session: str | None, config: Any) -> list[Any]:
    return engine(config).list_jobs(session)


@hookimpl
def fiber_read_job_logs(jid: str, config: Any) -> str | None:
    return engine(config).read_logs(jid) if jid.isdigit() else None


@hookimpl
def fiber_follow_logs(job: Any, config: Any) -> Any:
    j = _job(job)
    return None if j is None else j.engine.follow(j)


@hookimpl
def fiber_doctor(config: Any) -> list[Any]:
    from fiber_slurm.engine import SlurmError, private_spool, run
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
