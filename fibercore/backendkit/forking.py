"""Starting jobs by forking a template process (fiber-local does): import the worker's
side once, then in each forked child run the job as ``python -m fibercore.worker`` would."""

from __future__ import annotations

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
