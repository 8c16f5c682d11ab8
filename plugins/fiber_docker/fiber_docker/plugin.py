"""Docker backend: every Fiber process is a container on the local Docker engine.

Selected with ``FIBER_BACKEND=docker``. Jobs run ``python -m fibercore.worker`` with
the image's own Python, reach the master over host networking (Linux default) or a
bridge (the master then listens on the network's gateway), and get ``cpu``,
``memory`` and ``gpu`` from the JobSpec as Docker limits. See the README for the
configuration keys and what works where. The docker SDK is imported on first use.
"""

from __future__ import annotations

import atexit
import os
import secrets
import socket
import threading
from typing import Any

import pluggy

from fiber_docker import DEFAULT_IMAGE

hookimpl = pluggy.HookimplMarker("fiber")

#: The fibercore hook contract these hooks are written for (fibercore.hookspecs).
FIBER_CONTRACT = 2
NAME = "docker"

_engine: Any = None
_engine_lock = threading.Lock()


def engine(config: Any) -> Any:
    """This process's Engine (created, and Docker reached, on first use)."""
    global _engine
    if _engine is None:
        with _engine_lock:
            if _engine is None:
                from fiber_docker.engine import Engine

                _engine = Engine(config.get("docker_host") or None)
    return _engine


@atexit.register  # registered at import, so it runs after fibercore joined its jobs
def _at_exit() -> None:
    if _engine is not None:
        _engine.close()


def _container(job: Any) -> Any:
    if getattr(job, "backend", None) != NAME:
        return None
    return job.data


def _docker_socket(config: Any) -> str | None:
    """The daemon's unix socket path, to mount into jobs so that they can start jobs."""
    host = config.get("docker_host") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        return host[len("unix://"):]
    return None


@hookimpl
def fiber_config_options() -> list[Any]:
    from fibercore.types import Option

    def opt(name: str, typ: Any, default: Any, text: str) -> Any:
        return Option(name, typ, default, text, plugin="fiber-docker")

    return [
        opt("docker_network", str, None,
            "Network of the job containers: host (default on Linux: jobs reach the master on "
            "127.0.0.1), bridge (the master listens on the bridge's gateway), or a network name."),
        opt("docker_remove", bool, True, "Let Docker remove each container when it exits (its output is kept by the "
                                         "master)."),
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
        opt("docker_shm_size", str, None, "Size of /dev/shm in the containers, e.g. 2g (Docker's default is 64m)."),
        opt("docker_host", str, None, "Docker daemon to use (default: DOCKER_HOST or the local socket)."),
    ]


@hookimpl
def fiber_config_defaults() -> dict[str, Any]:
    """A Pool gets one container per CPU and starts two per CPU at a time: each start
    costs dockerd and runc ~0.1 s of CPU and the worker's Python as much again, so
    starting all at once only delays the first ones (bench/bench_docker.py: Pool(8)
    first result 0.21 s with 2 at a time, 0.66 s with all 8)."""
    cpus = os.cpu_count() or 1
    return {"pool_processes": cpus, "pool_start_concurrency": 2 * cpus, "default_image": DEFAULT_IMAGE}


@hookimpl
def fiber_listen_host(config: Any) -> str:
    from fiber_docker.options import default_network, network_gateway

    network = config.get("docker_network") or default_network()
    if network == "host":
        return "127.0.0.1"
    if os.environ.get("FIBERCORE_DOCKER_CONTAINER"):
        # A job starting jobs on a bridge: siblings reach it at its own address there.
        return socket.gethostbyname(socket.gethostname())
    gateway = network_gateway(engine(config).api.inspect_network(network))
    if gateway:
        return gateway
    raise RuntimeError(
        f"docker network {network!r} has no gateway address for the master to listen on; "
        "set listen_host (the address containers reach this machine at) and bind_host"
    )


@hookimpl
def fiber_create_job(spec: Any, config: Any) -> Any:
    from fiber_docker.options import build_request, container_name
    from fibercore.types import Job

    eng = engine(config)
    secret_hex = spec.secret_env.get("FIBER_SECRET")
    secret_source = eng.secret_source(spec.session, secret_hex) if secret_hex and len(spec.secret_env) == 1 else None
    request = build_request(
        spec, config,
        name=container_name(spec.session, spec.name, secrets.token_hex(3)),
        labels={"fiber-backend": NAME},
        secret_source=secret_source,
        docker_socket=_docker_socket(config),
    )
    job = eng.create(request, echo=bool(config.get("docker_echo_output", True)))
    return Job(jid=job.cid[:12], backend=NAME, data=job, host=None, pid=eng.pid_of(job), spec=spec,
               command=request.command)


@hookimpl
def fiber_job_status(job: Any) -> Any:
    from fibercore.types import JobStatus

    c = _container(job)
    if c is None:
        return None
    if c.exited.is_set():
        return JobStatus.UNKNOWN if c.lost else JobStatus.EXITED
    return JobStatus.RUNNING if c.started else JobStatus.PENDING


@hookimpl
def fiber_wait_job(job: Any, timeout: float | None, config: Any) -> int | None:
    c = _container(job)
    if c is None:
        return None
    return engine(config).wait(c, timeout)


@hookimpl
def fiber_terminate_job(job: Any, force: bool, config: Any) -> bool | None:
    c = _container(job)
    if c is None:
        return None
    engine(config).kill(c, force)
    return True


@hookimpl
def fiber_job_logs(job: Any) -> str | None:
    c = _container(job)
    if c is None:
        return None
    text = bytes(c.tail).decode("utf-8", "replace")
    if not text and not c.exited.is_set():
        return f"(container {c.name} has printed nothing yet)"
    return text


@hookimpl
def fiber_cleanup_jobs(session: str | None, config: Any) -> int:
    """Remove the containers of ``session`` (None: of every session whose master is gone)."""
    return engine(config).cleanup(session)


@hookimpl
def fiber_list_jobs(session: str | None, config: Any) -> list[Any]:
    return engine(config).list_jobs(session)


@hookimpl
def fiber_read_job_logs(jid: str, config: Any) -> str | None:
    eng = engine(config)
    if eng.fiber_container(jid) is None:
        return None
    return eng.read_logs(jid)


@hookimpl
def fiber_copy_files(jid: str, source: str, destination: str, into_job: bool, config: Any) -> bool | None:
    eng = engine(config)
    data = eng.fiber_container(jid)
    if data is None:
        return None
    eng.copy(data["Id"], source, destination, into_job, data["Config"].get("WorkingDir") or "/")
    return True


@hookimpl
def fiber_doctor(config: Any) -> list[Any]:
    from fibercore.types import Check

    try:
        eng = engine(config)
    except Exception as exc:
        return [Check(NAME, "Docker daemon reachable", False, str(exc),
                      "start dockerd (or set docker_host / DOCKER_HOST) and check this user may use its socket")]
    version = eng.client.version()
    checks = [Check(NAME, "Docker daemon reachable", True, f"Docker {version.get('Version')}, API "
                                                           f"{version.get('ApiVersion')}")]
    image = config.get("image") or config.get("default_image") or DEFAULT_IMAGE
    try:
        eng.client.images.get(image)
        checks.append(Check(NAME, f"image {image} present", True))
    except Exception:
        checks.append(Check(NAME, f"image {image} present", False, "not on this daemon",
                            "build it: python -m fiber_docker.image (or fiber run --build), or docker pull it"))
    return checks
