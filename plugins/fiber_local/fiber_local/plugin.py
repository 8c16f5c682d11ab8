"""Local backend: each job is a process on this machine (the default backend).

Why a plugin and not core code: it is replaceable like every backend, and it is the
reference a third party reads to write ``fiber-slurm``. The work is in
:mod:`fiber_local.engine` (forked from a pre-imported template process, as
multiprocessing's forkserver, or started as a new interpreter); this module is the
declarations.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from fibercore import hookimpl
from fibercore.backendkit import EngineBackend

if TYPE_CHECKING:
    from fiber_local.engine import Engine
    from fibercore.types import ConfigView, Option

NAME = "local"


class LocalBackend(EngineBackend["Engine"]):
    FIBER_CONTRACT = 3
    NAME = NAME
    DISTRIBUTION = "fiber-local"
    copies_files = True
    reports_usage = True

    def make_engine(self, config: ConfigView) -> Engine:
        from fiber_local.engine import Engine

        return Engine()

    @hookimpl
    def fiber_config_options(self) -> list[Option]:
        opt = self.option
        return [
            opt("local_echo_output", bool, True, "Echo the output of local jobs to the master's stdout/stderr."),
            opt("local_fork_template", bool, True,
                "Fork local jobs from a pre-imported template process (as multiprocessing's forkserver) "
                "instead of starting a new interpreter for each (Linux)."),
            opt("local_template_preload", str, "auto",
                "Modules the template process imports before it forks jobs, comma-separated (as "
                "multiprocessing's set_forkserver_preload), e.g. numpy,torch,gymnasium: each job then "
                "starts with them imported, in pages it shares with the other jobs. auto: numpy when "
                "the program has imported it; none: nothing."),
        ]

    @hookimpl
    def fiber_listen_host(self) -> str:
        return "127.0.0.1"

    @hookimpl
    def fiber_config_defaults(self) -> dict[str, Any]:
        """A local Pool gets one worker per CPU, as multiprocessing does, and starts its jobs a
        few at a time: they share this machine's CPUs, so the first ones are ready sooner."""
        cpus = os.cpu_count() or 1
        return {"pool_processes": cpus, "pool_start_concurrency": 2 * cpus}


plugin = LocalBackend()
