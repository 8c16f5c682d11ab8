"""A master killed with SIGKILL leaves no container behind: its workers notice the closed
connection and exit, and Docker removes them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

MASTER = textwrap.dedent("""
    import sys, time
    import fibercore as fc
    import docker_tasks

    fc.init(backend="docker", image=sys.argv[1], docker_labels=sys.argv[2], docker_echo_output=False)
    pool = fc.Pool(3)
    pool.map(docker_tasks.square, range(30))
    slow = pool.map_async(docker_tasks.hold, [60] * 3)
    print(fc.get_runtime().session, flush=True)
    time.sleep(120)
""")


def test_killed_master_leaves_no_containers(docker_image: str, docker_client: Any, no_containers_left: Any,
                                            tmp_path: Any) -> None:
    from docker_helpers import HERE, RUN_LABEL

    script = tmp_path / "master.py"
    script.write_text(MASTER)
    env = {**os.environ, "PYTHONPATH": str(HERE)}
    master = subprocess.Popen([sys.executable, str(script), docker_image, RUN_LABEL], stdout=subprocess.PIPE,
                              text=True, env=env, cwd=os.getcwd())
    try:
        session = master.stdout.readline().strip()  # type: ignore[union-attr]
        assert session, "the master did not start its pool"
        running = docker_client.api.containers(filters={"label": f"fiber-session={session}"})
        assert len(running) == 3
        os.kill(master.pid, signal.SIGKILL)
        master.wait(10)
        no_containers_left(session, timeout=60)
    finally:
        if master.poll() is None:
            master.kill()
