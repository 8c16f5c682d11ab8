"""Slurm backend: every Fiber process is a Slurm job (``FIBER_BACKEND=slurm``; chosen
automatically inside an allocation, where ``SLURM_JOB_ID`` is set).

Each job is ``sbatch`` of a two-line script that execs ``python -m fibercore.worker`` (the
master's interpreter unless ``python_exe`` says otherwise: nodes share the file system),
with the environment exported by sbatch itself (never on a command line), the session
secret in a 0600 file on the shared spool, resources as ``--cpus-per-task``, ``--mem`` and
``--gres=gpu:N``, and partition, account, QoS, time limit and extra ``#SBATCH`` options from
the configuration. The work is in :mod:`fiber_slurm.engine`; this module is the
declarations. Written on fibercore's public names only, as a third party would.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from fibercore import hookimpl
from fibercore.backendkit import EngineBackend, outward_address

if TYPE_CHECKING:
    from fiber_slurm.engine import Engine
    from fibercore.types import Check, ConfigView, Option

NAME = "slurm"


class SlurmBackend(EngineBackend["Engine"]):
    FIBER_CONTRACT = 3
    NAME = NAME
    DISTRIBUTION = "fiber-slurm"
    ENGINE_KEYS = ("slurm_spool_dir", "slurm_poll_interval", "slurm_kill_after")
    follows_logs = True

    def make_engine(self, config: ConfigView) -> Engine:
        from fiber_slurm.engine import Engine

        return Engine(config)

    def doctor(self, config: ConfigView) -> list[Check]:
        """Checked without an engine (which would start polling): commands, controller, spool."""
        from fiber_slurm.engine import doctor

        return doctor(config)

    @hookimpl
    def fiber_config_options(self) -> list[Option]:
        opt = self.option
        return [
            opt("slurm_partition", str, None, "Partition of the jobs (sbatch --partition; default: the cluster's)."),
            opt("slurm_account", str, None, "Account the jobs are charged to (--account)."),
            opt("slurm_qos", str, None, "Quality of service (--qos)."),
            opt("slurm_time", str, None, "Time limit of each job (--time, e.g. 2:00:00)."),
            opt("slurm_extra", str, None, "Extra sbatch options, as on an #SBATCH line (e.g. --constraint=a100 "
                                          "--exclusive)."),
            opt("slurm_spool_dir", str, "~/.fibercore/slurm",
                "A directory every node sees (shared file system): job output files and the session secret "
                "(0600)."),
            opt("slurm_poll_interval", float, 0.5, "Seconds between squeue polls (one call for all jobs of the "
                                                   "master)."),
            opt("slurm_kill_after", float, 10.0, "Seconds terminate() waits after SIGTERM before scancel kills the "
                                                 "job."),
        ]

    @hookimpl
    def fiber_detect_backend(self) -> str | None:
        return NAME if os.environ.get("SLURM_JOB_ID") else None

    @hookimpl
    def fiber_listen_host(self, config: ConfigView) -> str:
        return outward_address()


plugin = SlurmBackend()
