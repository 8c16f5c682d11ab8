"""A Pool of containers survives `docker kill`: tasks rerun, a replacement starts."""

from __future__ import annotations

import subprocess
import time
from typing import Any

import docker_tasks
from docker_helpers import docker_cli

import fibercore as fc


def test_pool_of_8_containers_survives_docker_kill(
    docker_config: dict[str, Any], docker_client: Any, no_containers_left: Any
) -> None:
    fc.init(backend="docker", **docker_config)
    try:
        session = fc.get_runtime().session
        with fc.Pool(8) as pool:
            results = pool.imap(docker_tasks.square, range(1000), chunksize=5)
            got = [next(results) for _ in range(100)]  # the map is under way on every worker
            workers = pool.workers()
            assert len(workers) == 8
            victim = workers[0]
            cid = victim.job.data.cid
            assert docker_client.containers.get(cid).status == "running"
            killed = subprocess.run([*docker_cli(), "kill", cid], capture_output=True, text=True)
            assert killed.returncode == 0, killed.stderr
            got += list(results)
            assert got == [x * x for x in range(1000)]
            assert pool.stats["retried_chunks"] >= 1  # the victim's tasks ran again elsewhere
            deadline = time.monotonic() + 60
            while (victim in pool.workers() or len(pool.workers()) < 8) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert victim not in pool.workers()
            assert len(pool.workers()) == 8
            assert pool.stats["replaced_workers"] >= 1
            assert victim.exitcode == -9  # docker kill: SIGKILL, as multiprocessing reports it
            replacement_ids = {w.job.data.cid for w in pool.workers()}
            assert cid not in replacement_ids
            running = {c["Id"] for c in docker_client.api.containers(filters={"label": f"fiber-session={session}"})}
            assert replacement_ids <= running
            assert pool.map(docker_tasks.square, range(20)) == [x * x for x in range(20)]
        no_containers_left(session)
    finally:
        fc.init()
