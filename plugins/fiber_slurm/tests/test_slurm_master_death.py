"""A master killed with SIGKILL leaves no running Slurm job: its workers notice the closed
connection and exit, so their jobs end; ``fiber cleanup`` removes its secret file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import fibercore as fc

MASTER = textwrap.dedent("""
    import json, sys, time
    import fibercore as fc
    from fibercore.testing.targets import sleep_for, triple

    fc.init(backend="slurm", **json.loads(sys.argv[1]))
    pool = fc.Pool(3)
    pool.map(triple, range(30))
    slow = pool.map_async(sleep_for, [60] * 3)
    print(fc.get_runtime().session, flush=True)
    time.sleep(120)
""")


def test_killed_master_leaves_no_running_job(slurm_config: dict[str, Any], tmp_path: Any) -> None:
    script = tmp_path / "master.py"
    script.write_text(MASTER)
    master = subprocess.Popen([sys.executable, str(script), json.dumps(slurm_config)], stdout=subprocess.PIPE,
                              text=True)
    fc.init(backend="slurm", **slurm_config)
    plugins = fc.get_runtime().plugins

    def active(session: str) -> list[Any]:
        return [j for j in plugins.list_jobs(session) if j.status is not fc.JobStatus.EXITED]

    try:
        session = master.stdout.readline().strip()  # type: ignore[union-attr]
        assert session, "the master did not start its pool"
        assert len(active(session)) == 3
        os.kill(master.pid, signal.SIGKILL)
        master.wait(10)
        deadline = time.monotonic() + 60
        while active(session) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert active(session) == []
        spool = Path(slurm_config["slurm_spool_dir"])
        assert list(spool.glob(f"secret-{session}-*")), "the dead master's secret file should still be there"
        plugins.cleanup_jobs(session)  # fiber cleanup --session: removes what the master could not
        assert not list(spool.glob(f"secret-{session}-*"))
    finally:
        if master.poll() is None:
            master.kill()
        fc.init()
