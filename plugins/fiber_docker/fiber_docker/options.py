"""From a JobSpec and the configuration to the arguments of Docker's create call.

Pure functions (no Docker client), so every option's mapping is unit-tested and the
engine only sends what these return.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fibercore.backendkit import parse_pairs, signal_exit_code

if TYPE_CHECKING:
    from fibercore.types import ConfigView

#: Where the session secret is mounted inside each container (read-only).
SECRET_TARGET = "/run/fiber/secret"


class DockerOptionError(ValueError):
    """A docker_* config value cannot be used; the message shows the expected form."""


def default_network() -> str:
    """Host networking on Linux (jobs reach the master on 127.0.0.1); elsewhere, where
    Docker runs in a VM, the bridge."""
    return "host" if sys.platform.startswith("linux") else "bridge"


def interface_ipv4(name: str) -> str | None:
    """The IPv4 address of this machine's network interface ``name`` (None if absent)."""
    if not sys.platform.startswith("linux"):
        return None
    import fcntl
    import socket
    import struct

    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name[:15].encode()))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def network_gateway(info: Mapping[str, Any],
                    interface_address: Callable[[str], str | None] = interface_ipv4) -> str | None:
    """The gateway of a Docker network (``docker network inspect`` data): where its
    containers reach this machine.

    ``IPAM.Config[].Gateway`` when Docker reports it. A dockerd started without a
    configured default bridge reports only the subnet; Docker's bridge driver then
    gives the gateway address to the bridge interface (``docker0``, or ``br-<id>``
    for a user-defined network), so that interface's address is the gateway; where
    it cannot be read (a remote daemon), Docker's default IPAM choice: the subnet's
    first host address.
    """
    pools = [p for p in ((info.get("IPAM") or {}).get("Config") or []) if isinstance(p, Mapping)]
    for pool in pools:
        if pool.get("Gateway"):
            return str(pool["Gateway"]).split("/")[0]
    if info.get("Driver") == "bridge":
        options = info.get("Options") or {}
        bridge = options.get("com.docker.network.bridge.name") or f"br-{str(info.get('Id', ''))[:12]}"
        found = interface_address(bridge)
        if found:
            return found
    for pool in pools:
        try:
            subnet = ipaddress.ip_network(str(pool.get("Subnet", "")), strict=False)
        except ValueError:
            continue
        if subnet.version == 4 and subnet.num_addresses > 2:
            return str(subnet.network_address + 1)
    return None


def parse_volumes(text: str | None) -> dict[str, dict[str, str]]:
    """``"/data:/data:ro,/home/me/out:/out"`` -> the SDK's volume mapping."""
    volumes: dict[str, dict[str, str]] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        pieces = item.split(":")
        if len(pieces) not in (2, 3) or not pieces[0] or not pieces[1]:
            raise DockerOptionError(
                f"docker_volumes entry {item!r} is not HOST_PATH:CONTAINER_PATH[:ro|rw]; "
                "example: docker_volumes=/data:/data:ro,/scratch:/scratch"
            )
        mode = pieces[2] if len(pieces) == 3 else "rw"
        if mode not in ("ro", "rw"):
            raise DockerOptionError(f"docker_volumes entry {item!r}: the mode must be ro or rw, not {mode!r}")
        if not os.path.isabs(pieces[0]) or not os.path.isabs(pieces[1]):
            raise DockerOptionError(f"docker_volumes entry {item!r}: both paths must be absolute")
        volumes[pieces[0]] = {"bind": pieces[1], "mode": mode}
    return volumes


def parse_labels(text: str | None) -> dict[str, str]:
    """``"team=rl,exp=42"`` -> ``{"team": "rl", "exp": "42"}``."""
    return parse_pairs(text, "docker_labels", DockerOptionError)


def container_name(session: str, process_name: str, suffix: str) -> str:
    """A readable, unique container name: ``fiber-<session>-<process>-<suffix>``."""
    slug = re.sub(r"[^a-zA-Z0-9_.-]+", "-", process_name).strip("-.").lower()[:40] or "job"
    return f"fiber-{session[:8]}-{slug}-{suffix}"


def exit_code(status: int) -> int:
    """A container's exit status in multiprocessing's convention (128+N -> -N)."""
    return signal_exit_code(status)


@dataclass
class CreateRequest:
    """Everything the engine passes to ``create_container`` / ``create_host_config``."""

    image: str
    command: list[str]
    name: str
    environment: dict[str, str]
    labels: dict[str, str]
    working_dir: str | None
    user: str | None
    host_config: dict[str, Any] = field(default_factory=dict)


def build_request(
    spec: Any,
    cfg: ConfigView,
    *,
    name: str,
    labels: Mapping[str, str],
    secret_source: str | None,
    docker_socket: str | None,
) -> CreateRequest:
    """Map ``spec`` (fibercore.types.JobSpec) and the ``docker_*`` config to Docker.

    - the command runs the image's own ``python`` unless ``python_exe`` was set;
    - cpu -> NanoCpus, memory (MiB) -> Memory, gpu -> a device request for N GPUs;
    - volumes: ``docker_volumes``, the spec's, the master's working directory at the
      same path (``docker_mount_cwd``), the secret file, the Docker socket
      (``docker_nested``) so that jobs can start jobs;
    - ``docker_network``: host (default on Linux), bridge, or a network's name.
    """
    image = spec.image or cfg.get("default_image")
    if not image:
        raise DockerOptionError("no image: set image=... (FIBER_IMAGE) to a worker image, see the fiber-docker README")
    command = spec.argv("python")  # unless python_exe was set: the image's, found on its PATH
    environment = dict(spec.env)
    environment["PYTHONUNBUFFERED"] = "1"
    # `python -m` would put the working directory (the mounted cwd) first on sys.path,
    # ahead of the image's fibercore; the master's sys.path still reaches the job. A
    # script (a master `fiber run` started) keeps its own folder first, as always.
    if spec.args[:1] == ["-m"]:
        environment["PYTHONSAFEPATH"] = "1"
    environment["FIBERCORE_DOCKER_CONTAINER"] = "1"
    volumes = parse_volumes(cfg.get("docker_volumes"))
    volumes.update(spec.volumes or {})
    working_dir = cfg.get("docker_workdir") or None
    cwd = spec.cwd
    if cfg.get("docker_mount_cwd", True) and cwd and cwd != "/" and os.path.isabs(cwd):
        volumes.setdefault(cwd, {"bind": cwd, "mode": "rw"})
        working_dir = working_dir or cwd
    if secret_source:
        volumes[secret_source] = {"bind": SECRET_TARGET, "mode": "ro"}
        environment["FIBER_SECRET_FILE"] = SECRET_TARGET
        environment["FIBERCORE_DOCKER_SECRET_SOURCE"] = secret_source
    else:
        environment.update(spec.secret_env)
    if docker_socket and cfg.get("docker_nested", False):
        volumes.setdefault(docker_socket, {"bind": docker_socket, "mode": "rw"})
        environment["DOCKER_HOST"] = f"unix://{docker_socket}"
    network = cfg.get("docker_network") or default_network()
    host_config: dict[str, Any] = {
        "network_mode": network,
        "init": bool(cfg.get("docker_init", True)),
        "auto_remove": bool(cfg.get("docker_remove", True)),
        "binds": volumes,
    }
    if spec.cpu:
        host_config["nano_cpus"] = int(float(spec.cpu) * 1e9)
    if spec.memory:
        host_config["mem_limit"] = int(spec.memory) * 1024 * 1024
    if spec.gpu:
        host_config["device_requests"] = [{"count": int(spec.gpu), "capabilities": [["gpu"]]}]
    if cfg.get("docker_shm_size"):
        host_config["shm_size"] = cfg.get("docker_shm_size")
    all_labels = dict(parse_labels(cfg.get("docker_labels")))
    all_labels.update(spec.labels or {})
    all_labels.update(labels)
    return CreateRequest(
        image=image,
        command=command,
        name=name,
        environment=environment,
        labels=all_labels,
        working_dir=working_dir,
        user=cfg.get("docker_user") or None,
        host_config=host_config,
    )
