"""Docker backend: every Fiber process is a container on the local Docker engine.

Selected with ``FIBER_BACKEND=docker``. Jobs run ``python -m fibercore.worker`` with
the image's own Python, reach the master over host networking (Linux default) or a
bridge (the master then listens on the network's gateway), and get ``cpu``,
``memory`` and ``gpu`` from the JobSpec as Docker limits. See the README for the
configuration keys and what works where. The work is in :mod:`fiber_docker.engine`
(the docker SDK is imported on first use); this module is the declarations.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING, Any

from fiber_docker import DEFAULT_IMAGE
from fibercore import hookimpl
from fibercore.backendkit import EngineBackend

if TYPE_CHECKING:
    from fiber_docker.engine import Engine
    from fibercore.types import ConfigView, Option

NAME = "docker"


class DockerBackend(EngineBackend["Engine"]):
    FIBER_CONTRACT = 3
    NAME = NAME
    DISTRIBUTION = "fiber-docker"
    ENGINE_KEYS = ("docker_host",)
    copies_files = True
    reach_check = "Docker daemon reachable"
    reach_fix = "start dockerd (or set docker_host / DOCKER_HOST) and check this user may use its socket"

    def make_engine(self, config: ConfigView) -> Engine:
        from fiber_docker.engine import Engine

        return Engine(config.get("docker_host") or None)

    @hookimpl
    def fiber_config_options(self) -> list[Option]:
        opt = self.option
        return [
            opt("docker_network", str, None,
                "Network of the job containers: host (default on Linux: jobs reach the master on "
                "127.0.0.1), bridge (the master listens on the bridge's gateway), or a network name."),
            opt("docker_remove", bool, True, "Let Docker remove each container when it exits (its output is kept by "
                                             "the master)."),
            opt("docker_echo_output", bool, True, "Echo the containers' output to the master's stdout/stderr."),
            opt("docker_volumes", str, None, "Extra bind mounts: HOST:CONTAINER[:ro|rw],..."),
            opt("docker_mount_cwd", bool, True,
                "Mount the master's working directory at the same path and start jobs there "
                "(so modules next to your script import in the jobs)."),
            opt("docker_workdir", str, None, "Working directory inside the containers (default: the master's, when "
                                             "mounted)."),
            opt("docker_labels", str, None, "Extra container labels: KEY=VALUE,..."),
            opt("docker_user", str, None, "User (uid[:gid]) the containers run as (default: the image's)."),
            opt("docker_init", bool, True, "Run an init process in each container (forwards SIGTERM, reaps zombies)."),
            opt("docker_nested", bool, False,
                "Mount the Docker socket into jobs so that they can start jobs (nested Process, Pool "
                "in a Process). It gives jobs control of the Docker host (root on it): on only for "
                "trusted code (fiber run gives it to the master's container only)."),
            opt("docker_shm_size", str, None, "Size of /dev/shm in the containers, e.g. 2g (Docker's default is "
                                              "64m)."),
            opt("docker_host", str, None, "Docker daemon to use (default: DOCKER_HOST or the local socket)."),
        ]

    @hookimpl
    def fiber_config_defaults(self) -> dict[str, Any]:
        """A Pool gets one container per CPU and starts two per CPU at a time: each start
        costs dockerd and runc ~0.1 s of CPU and the worker's Python as much again, so
        starting all at once only delays the first ones (bench/bench_docker.py: Pool(8)
        first result 0.21 s with 2 at a time, 0.66 s with all 8)."""
        cpus = os.cpu_count() or 1
        return {"pool_processes": cpus, "pool_start_concurrency": 2 * cpus, "default_image": DEFAULT_IMAGE}

    @hookimpl
    def fiber_listen_host(self, config: ConfigView) -> str:
        from fiber_docker.options import default_network, network_gateway

        network = config.get("docker_network") or default_network()
        if network == "host":
            return "127.0.0.1"
        if os.environ.get("FIBERCORE_DOCKER_CONTAINER"):
            # A job starting jobs on a bridge: siblings reach it at its own address there.
            return socket.gethostbyname(socket.gethostname())
        gateway = network_gateway(self.engine(config).api.inspect_network(network))
        if gateway:
            return str(gateway)
        raise RuntimeError(
            f"docker network {network!r} has no gateway address for the master to listen on; "
            "set listen_host (the address containers reach this machine at) and bind_host"
        )


plugin = DockerBackend()
