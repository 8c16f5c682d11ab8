"""A shared object given to containers, on a real dockerd: a container has its own /dev/shm,
so it reads the object once from the master and keeps its own copy there."""

from __future__ import annotations

import os
from typing import Any

import docker_tasks
import pytest

import fibercore as fc


@pytest.mark.timeout(600)
def test_a_container_job_reads_its_own_copy_from_the_master(docker_config: dict[str, Any]) -> None:
    fc.init(backend="docker", **docker_config)
    try:
        blob = bytearray(os.urandom(3 << 20))  # out of band, over several reads of the service
        handle = fc.shared({"blob": blob, "name": "noise"})
        out = fc.Queue()
        p = fc.Process(target=docker_tasks.shared_in_container, args=(handle, out))
        p.start()
        head, size, name, copies, not_mapped = out.get(timeout=300)
        p.join(60)
        assert p.exitcode == 0
        assert (head, size, name) == (bytes(blob[:4]), len(blob), "noise")
        assert not_mapped  # the master's segment is not on the container's machine
        assert copies == [f"fcs-copy-{handle._tag.hex()}"]  # the container's own copy
    finally:
        fc.init()
