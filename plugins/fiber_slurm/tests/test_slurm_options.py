"""Resources and site options become sbatch options; Slurm applies them (scontrol shows them)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
from fiber_slurm.engine import sbatch_options

import fibercore as fc
from fibercore.testing.targets import sleep_for
from fibercore.types import JobSpec


class Config(dict):  # type: ignore[type-arg]
    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key, default)


def test_resources_and_site_keys_map_to_sbatch_options() -> None:
    spec = JobSpec(args=[], cpu=2.5, memory=512, gpu=1)
    cfg = Config(slurm_partition="gpu", slurm_account="rl-lab", slurm_qos="short", slurm_time="1:00:00",
                 slurm_extra="--constraint=a100 --exclusive")
    assert sbatch_options(spec, cfg) == ["--cpus-per-task=3", "--mem=512M", "--gres=gpu:1", "--partition=gpu",
                                         "--account=rl-lab", "--qos=short", "--time=1:00:00",
                                         "--constraint=a100", "--exclusive"]
    assert sbatch_options(JobSpec(args=[]), Config()) == []


@fc.meta(gpu=1)
def needs_a_gpu() -> None:
    """Never runs: the test node has no GPU."""


def test_slurm_applies_the_resources_and_options(slurm_config: dict[str, Any]) -> None:
    fc.init(backend="slurm", slurm_time="5:00", slurm_extra="--comment=fibercore-test", cpu_per_job=2,
            mem_per_job=300, **slurm_config)
    try:
        p = fc.Process(target=sleep_for, args=(30,))
        p.start()
        shown = subprocess.run(["scontrol", "show", "job", "-o", p._popen.job.jid], capture_output=True, text=True,
                               check=True).stdout
        for expected in ("NumCPUs=2", "MinMemoryNode=300M", "TimeLimit=00:05:00", "Comment=fibercore-test",
                         "Partition=debug"):
            assert expected in shown, (expected, shown)
        p.terminate()
        p.join(30)
        assert p.exitcode == -15
        q = fc.Process(target=needs_a_gpu)
        with pytest.raises(fc.ProcessError, match="gres"):
            q.start()
    finally:
        for child in fc.active_children():
            child.kill()
            child.join(30)
        fc.init()


def test_a_spool_others_can_read_gets_a_private_directory_inside(tmp_path):
    """Job output and secret files never go where other users can list or read them."""
    import os

    from fiber_slurm.engine import SlurmError, private_spool

    mine = tmp_path / "mine"
    assert private_spool(str(mine)) == str(mine) and (mine.stat().st_mode & 0o777) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    inside = private_spool(str(shared))
    assert inside == str(shared / f"fibercore-{os.geteuid()}") and (os.stat(inside).st_mode & 0o777) == 0o700
    os.chmod(inside, 0o755)  # someone opened it: refused, with the fix
    with pytest.raises(SlurmError, match="mode 0700"):
        private_spool(str(shared))
