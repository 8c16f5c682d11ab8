"""A master killed with SIGKILL leaves no process on the hosts: its ssh sessions see their
stdin close, and each launcher kills its job's process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from typing import Any

import fibercore as fc

MASTER = textwrap.dedent("""
    import json, sys, time
    import fibercore as fc
    from fibercore.testing.targets import sleep_for, triple

    fc.init(backend="ssh", **json.loads(sys.argv[1]))
    pool = fc.Pool(3)
    pool.map(triple, range(30))
    slow = pool.map_async(sleep_for, [60] * 3)
    print(fc.get_runtime().session, flush=True)
    time.sleep(120)
""")


def test_killed_master_leaves_no_process_on_the_hosts(ssh_config: dict[str, Any], tmp_path: Any) -> None:
    script = tmp_path / "master.py"
    script.write_text(MASTER)
    master = subprocess.Popen([sys.executable, str(script), json.dumps({**ssh_config, "ssh_echo_output": False})],
                              stdout=subprocess.PIPE, text=True)
    fc.init(backend="ssh", **ssh_config)
    plugins = fc.get_runtime().plugins
    try:
        session = master.stdout.readline().strip()  # type: ignore[union-attr]
        assert session, "the master did not start its pool"
        # A Pool launches its jobs in the background: its first map can end before the last
        # job's ssh session is up on its host (seen in CI: 2 of 3 listed at that moment).
        deadline = time.monotonic() + 30
        while len(plugins.list_jobs(session)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(plugins.list_jobs(session)) == 3
        os.kill(master.pid, signal.SIGKILL)
        master.wait(10)
        deadline = time.monotonic() + 30
        while plugins.list_jobs(session) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert plugins.list_jobs(session) == []
    finally:
        if master.poll() is None:
            master.kill()
        fc.init()
