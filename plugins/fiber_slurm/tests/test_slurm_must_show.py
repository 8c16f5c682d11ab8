"""What a Slurm user meets: a Pool whose job an operator ``scancel``s mid-map, a request the
node cannot satisfy, and ``fiber run`` of a program whose master is itself a Slurm job."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

import fibercore as fc
from fibercore.testing import fiber, session_of
from fibercore.testing.targets import triple_after


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    yield
    for p in fc.active_children():
        p.kill()
        p.join(30)
    fc.init()


def test_pool_of_8_jobs_survives_one_scancelled_mid_map(slurm_config: dict[str, Any]) -> None:
    fc.init(backend="slurm", **slurm_config)
    rt = fc.get_runtime()
    with fc.Pool(8) as pool:
        result = pool.starmap_async(triple_after, [(i, 0.3) for i in range(96)], chunksize=1)
        deadline = time.monotonic() + 60
        running: list[Any] = []
        while len(running) < 8 and time.monotonic() < deadline:
            running = [j for j in rt.plugins.list_jobs(rt.session) if j.status is fc.JobStatus.RUNNING]
            time.sleep(0.2)
        assert len(running) == 8, running
        victim = running[3].jid
        time.sleep(1.0)  # mid-map: the victim holds a task
        subprocess.run(["scancel", victim], check=True)  # what an operator (or preemption) does
        assert result.get(180) == [3 * i for i in range(96)]
        jobs = {j.jid: j for j in rt.plugins.list_jobs(rt.session)}
    assert jobs[victim].status is fc.JobStatus.EXITED
    assert len(jobs) >= 9, f"no replacement job was submitted: {sorted(jobs)}"


@fc.meta(memory=100_000)
def needs_100_gb() -> None:
    """Never runs: the test node has 8,000 MiB."""


def test_more_memory_than_the_node_has_fails_start_at_once_with_slurms_reason(slurm_config: dict[str, Any]) -> None:
    fc.init(backend="slurm", start_timeout=120, **slurm_config)
    p = fc.Process(target=needs_100_gb)
    began = time.monotonic()
    with pytest.raises(fc.ProcessError, match="Memory specification can not be satisfied"):
        p.start()
    assert time.monotonic() - began < 10  # Slurm's refusal, not start_timeout


def test_fiber_run_master_is_a_slurm_job_and_streams_its_output(slurm_conf: Path, tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(
        "import sys\nimport fibercore as mp\n\n"
        "def square(x):\n    return x * x\n\n"
        "if __name__ == '__main__':\n"
        "    with mp.Pool(2) as pool:\n"
        "        print('squares', pool.map(square, range(6)), flush=True)\n"
        "    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)\n")
    env = {"FIBER_BACKEND": "slurm", "FIBER_SLURM_SPOOL_DIR": str(slurm_conf.parent / "fiber"),
           "FIBER_SLURM_POLL_INTERVAL": "0.2", "FIBER_LISTEN_HOST": "127.0.0.1"}
    done = fiber("run", "--", "python", "app.py", "3", cwd=tmp_path, env=env)
    assert done.returncode == 3, done.stderr
    assert "squares [0, 1, 4, 9, 16, 25]" in done.stdout
    session = session_of(done.stderr)
    rows = [r.split() for r in fiber("ps", "--session", session, env=env).stdout.splitlines()[1:]]
    assert sorted(r[2] for r in rows)[-1] == "master" and len(rows) == 3, rows  # the master and its 2 workers
    assert all(r[3] == "exited" for r in rows), rows
