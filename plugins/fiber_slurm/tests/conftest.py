"""A real Slurm for the tests (slurm_cluster.py): brought up once per session, stopped by PID."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import slurm_cluster

from fibercore.testing import skip_or_fail


@pytest.fixture(scope="session")
def slurm_conf(tmp_path_factory: Any) -> Iterator[Path]:
    why = slurm_cluster.problem()
    if why:
        skip_or_fail(why, "slurm")
    state = Path(tmp_path_factory.mktemp("slurm"))
    conf = slurm_cluster.up(state)
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)  # the master's sbatch, and jobs that start jobs
    try:
        yield conf
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved
        slurm_cluster.down(state)


@pytest.fixture
def slurm_config(slurm_conf: Path) -> dict[str, Any]:
    return {"listen_host": "127.0.0.1", "slurm_spool_dir": str(slurm_conf.parent / "fiber"),
            "slurm_poll_interval": 0.2, "slurm_kill_after": 3.0}
