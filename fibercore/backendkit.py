"""Small helpers that backend plugins share (no API objects, no heavy imports).

- :func:`parse_pairs` reads ``KEY=VALUE,...`` config values (labels, tags, env).
- :func:`signal_exit_code` turns a container's exit status into multiprocessing's
  convention (an init or shell reports a process killed by signal N as 128+N).
- :func:`outward_address` is the address of this machine that jobs elsewhere are most
  likely to reach, for a master running outside the cluster.
- :data:`MASTER_LABEL` (the core puts it on every job: which process started it) and
  :func:`sessions_to_clean` give ``fiber_cleanup_jobs(None)`` one meaning on every backend:
  the jobs of sessions whose master is gone.
- :func:`preload_worker` and :func:`run_worker` let a backend start jobs by forking a
  template process (fiber-local does): import the worker's side once, then in each forked
  child run the job as ``python -m fibercore.worker`` would.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping

#: The label the core puts on every job (``JobSpec.labels``): ``<machine>.<pid>.<start>`` of
#: the process that started it (:func:`master_label`); a value Kubernetes accepts as a label.
MASTER_LABEL = "fiber-master"
#: ``fiber-process``: the process's name; ``master`` for the master ``fiber run`` started as a job.
PROCESS_LABEL = "fiber-process"


def master_label() -> str:
    """This process as :data:`MASTER_LABEL` names it: machine (boot and network namespace),
    pid and start time (a pid alone may be reused)."""
    from fibercore.util import machine_identity, process_start

    return f"{machine_identity() or 'unknown'}.{os.getpid()}.{process_start(os.getpid()) or 0}"


def master_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the master that started a job (by the job's labels) still runs: True or False
    when it ran on this machine, None when that cannot be told here (another machine, or a job
    without the label)."""
    from fibercore.util import machine_identity, process_start

    machine, _, rest = (labels.get(MASTER_LABEL) or "").partition(".")
    pid, _, start = rest.partition(".")
    if not machine or not pid.isdigit() or machine != machine_identity():
        return None
    return process_start(int(pid)) == start


def sessions_to_clean(jobs: Iterable[tuple[str, Mapping[str, str], bool]]) -> set[str]:
    """What ``fiber_cleanup_jobs(None)`` removes, from each job's (session, labels, still
    running): the sessions whose master is gone.

    1. A session with a master job ``fiber run`` started (``fiber-process=master``): gone when
       no such job runs.
    2. Otherwise, a session whose master ran on this machine: gone when that process ended.
    3. Otherwise (its master is elsewhere, or its jobs carry no label): gone when none of its
       jobs runs any more; one that runs is left to its master (``fiber cleanup SESSION``
       removes it on purpose).
    """
    by_session: dict[str, list[tuple[Mapping[str, str], bool]]] = {}
    for session, labels, running in jobs:
        by_session.setdefault(session, []).append((labels, running))
    gone = set()
    for session, members in by_session.items():
        masters = [running for labels, running in members if labels.get(PROCESS_LABEL) == "master"]
        if masters:
            if not any(masters):
                gone.add(session)
            continue
        verdicts = {master_alive(labels) for labels, _ in members}
        if verdicts & {True, False}:
            if True not in verdicts:
                gone.add(session)
        elif not any(running for _, running in members):
            gone.add(session)
    return gone


def parse_pairs(text: str | None, key: str, error: type[Exception] = ValueError,
                example: str = "team=rl,exp=42") -> dict[str, str]:
    """``"a=1, b = 2"`` -> ``{"a": "1", "b": "2"}``; a malformed entry raises ``error``
    naming the config ``key`` and the expected form."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise error(f"{key} entry {item!r} is not KEY=VALUE; example: {key}={example}")
        out[name.strip()] = value.strip()
    return out


def signal_exit_code(status: int) -> int:
    """128+N (a process killed by signal N) becomes -N; other statuses stay as they are."""
    if 128 < status < 128 + 65:
        return -(status - 128)
    return status


def outward_address() -> str:
    """The address of the interface that routes outward (selecting a route sends no
    packet), or 127.0.0.1 when there is no route."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects a route
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()


#: The modules every job imports: the worker, the process and admin protocol, the built-in
#: transport and serializer, and the building blocks a job's target uses.
WORKER_MODULES = (
    "fibercore",
    "fibercore.worker",
    "fibercore.process",
    "fibercore.admin",
    "fibercore.connection",
    "fibercore.queues",
    "fibercore.pool",
    "fibercore.builtins.tcp_transport",
    "fibercore.builtins.cloudpickle_serializer",
    "fibercore.sync.handles",
    "fibercore.sharing",
)


def preload_worker() -> None:
    """Import what a job needs, in a process that will fork jobs (it starts no thread)."""
    import importlib

    for name in WORKER_MODULES:
        importlib.import_module(name)


def run_worker(secret: str) -> int:
    """Run this process as a job: the job's environment is in ``os.environ`` already, its
    secrets (``KEY=value`` lines) are given here, never through the environment. Returns
    the exit code for ``os._exit``."""
    from fibercore import runtime, worker

    runtime.adopt_inherited_secret(secret)
    return worker.run()
