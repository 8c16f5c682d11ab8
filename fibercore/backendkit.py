"""Small helpers that backend plugins share (no API objects, no heavy imports).

- :func:`parse_pairs` reads ``KEY=VALUE,...`` config values (labels, tags, env).
- :func:`signal_exit_code` turns a container's exit status into multiprocessing's
  convention (an init or shell reports a process killed by signal N as 128+N).
- :func:`outward_address` is the address of this machine that jobs elsewhere are most
  likely to reach, for a master running outside the cluster.
- :func:`preload_worker` and :func:`run_worker` let a backend start jobs by forking a
  template process (fiber-local does): import the worker's side once, then in each forked
  child run the job as ``python -m fibercore.worker`` would.
"""

from __future__ import annotations

import socket


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
