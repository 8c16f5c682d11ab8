"""Real OpenSSH servers for the tests: Debian's ``sshd`` on 127.0.0.1 on a free port, with a
host key and a client key made per test session, stopped by its PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

SSHD = "/usr/sbin/sshd"

CONFIG = """Port {port}
ListenAddress {address}
HostKey {state}/host_ed25519
AuthorizedKeysFile {state}/authorized_keys
PidFile {pid_file}
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxStartups 64:30:128
MaxSessions 64
AcceptEnv no
Subsystem sftp internal-sftp
"""


def problem() -> str | None:
    """Why no sshd can be started here, or None."""
    for tool in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")):
        if not tool or not os.path.exists(tool):
            return ("openssh-server/openssh-client is missing: apt-get install openssh-server (scripts/test does "
                    "it as root on Debian)")
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def client_options(known_hosts: Path) -> str:
    """ssh options for strict host key checking against the keys these tests made."""
    return f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={known_hosts}"


def keygen(path: Path) -> str:
    """An ed25519 key pair at ``path``; returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (path.parent / (path.name + ".pub")).read_text().strip()


class Sshd:
    """One sshd with its own host key; ``client_key`` may log in as the current user."""

    def __init__(self, state: Path, client_public: str, address: str = "127.0.0.1") -> None:
        state.mkdir(parents=True, exist_ok=True)
        self.state = state
        self.address = address
        self.port = free_port()
        self.host_public = keygen(state / "host_ed25519")
        (state / "authorized_keys").write_text(client_public + "\n")
        (state / "sshd_config").write_text(CONFIG.format(port=self.port, address=address, state=state,
                                                         pid_file=state / "sshd.pid"))
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        subprocess.run([SSHD, "-f", str(state / "sshd_config"), "-E", str(state / "sshd.log")], check=True)
        self.pid = self._wait_pid()
        self._wait_port()

    def _wait_pid(self) -> int:
        for _ in range(100):
            try:
                return int((self.state / "sshd.pid").read_text())
            except (OSError, ValueError):
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not start: {(self.state / 'sshd.log').read_text()[-2000:]}")

    def _wait_port(self) -> None:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex((self.address, self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"sshd does not listen on {self.address}:{self.port}")

    def known_hosts_line(self) -> str:
        return f"[{self.address}]:{self.port} {self.host_public}"

    def stop(self) -> None:
        """Stop this sshd by its PID (its sessions end with their own processes)."""
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


SSHD_DOCKERFILE = """FROM {base}
RUN printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
 && apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openssh-server \\
 && rm -f /usr/sbin/policy-rc.d && rm -rf /var/lib/apt/lists/* && mkdir -p /run/sshd
"""


def sshd_image(client: Any, worker_image: str) -> str:
    """The worker image plus Debian's openssh-server, built once per worker image."""
    from fiber_docker.testing import layered_image

    return layered_image(client, worker_image, SSHD_DOCKERFILE, "fibercore-test/sshd")


#: The command of a container that is an sshd host (its state mounted at /fiber-ssh).
CONTAINER_SSHD = ["/usr/sbin/sshd", "-D", "-e", "-f", "/fiber-ssh/sshd_config"]


def container_state(state: Path, client_public: str) -> str:
    """A host key, the client's key and an sshd_config on port 22 in ``state``, to be mounted
    at /fiber-ssh in a container running :data:`CONTAINER_SSHD`; returns the host's public key."""
    state.mkdir(parents=True, exist_ok=True)
    host_public = keygen(state / "host_ed25519")
    (state / "authorized_keys").write_text(client_public + "\n")
    (state / "sshd_config").write_text(CONFIG.format(port=22, address="0.0.0.0", state="/fiber-ssh",
                                                     pid_file="/run/sshd.pid"))
    return host_public


def answers_ssh(address: str) -> bool:
    """Whether something accepts connections on ``address``:22."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((address, 22)) == 0


class ContainerSshd:
    """A second "host": sshd in a container on the docker bridge, with its own address,
    host key and processes; :meth:`kill` takes the whole host down at once."""

    def __init__(self, client: Any, image: str, state: Path, client_public: str, labels: dict[str, str]) -> None:
        self.port = 22
        self.host_public = container_state(state, client_public)
        self.container = client.containers.run(
            image, CONTAINER_SSHD, detach=True, labels=labels,
            volumes={str(state): {"bind": "/fiber-ssh", "mode": "ro"}}, network_mode="bridge")
        for _ in range(100):
            self.container.reload()
            self.address = self.container.attrs["NetworkSettings"]["IPAddress"]
            if self.address and answers_ssh(self.address):
                break
            time.sleep(0.1)
        else:
            raise RuntimeError(f"sshd in the container does not answer: {self.container.logs()[-2000:]!r}")
        self.gateway = self.container.attrs["NetworkSettings"]["Gateway"]

    def known_hosts_line(self) -> str:
        return f"{self.address} {self.host_public}"

    def kill(self) -> None:
        """SIGKILL to the container: its sshd and every process on the "host" die at once."""
        self.container.kill()

    def remove(self) -> None:
        self.container.remove(force=True)


def start_cluster(client: Any, worker_image: str, n: int, client_dir: Path, client_public: str,
                  known_hosts: Path, slots: int = 8, mounts: tuple[str, ...] = ()) -> Any:
    """A multi-host cluster (``fiber_docker.cluster.Cluster``) of ``n`` sshd hosts built on
    ``worker_image``: each host's key goes into ``known_hosts``, the client's key lets one in,
    and ``cluster.hostfile`` (in ``client_dir``) lists the hosts with ``slots`` each.

    ``client_dir`` (key, known_hosts, the hostfile) and each path of ``mounts`` are at the
    same path on every host, read-only, as a shared home directory is on a real cluster: a
    job there starts nested Processes over ssh with the same configuration, and imports what
    the master imports from a mounted checkout. Remove it with ``cluster.remove()``."""
    import tempfile

    from fiber_docker.cluster import Cluster

    image = sshd_image(client, worker_image)
    states = {i: Path(tempfile.mkdtemp(prefix=f"fibercore-cluster-host{i}-")) for i in range(1, n + 1)}

    def remove_states() -> None:
        for state in states.values():
            shutil.rmtree(state, ignore_errors=True)

    cluster = None
    try:
        keys = {i: container_state(state, client_public) for i, state in states.items()}
        shared = {str(client_dir): {"bind": str(client_dir), "mode": "ro"},
                  **{path: {"bind": path, "mode": "ro"} for path in mounts}}
        cluster = Cluster(image, n, command=CONTAINER_SSHD, client=client,
                          volumes=lambda i: {str(states[i]): {"bind": "/fiber-ssh", "mode": "ro"}, **shared},
                          ready=lambda host: answers_ssh(host.address))
        with open(known_hosts, "a") as fh:
            for i, host in enumerate(cluster.hosts, 1):
                fh.write(f"{host.address} {keys[i]}\n")
        cluster.hostfile = client_dir / "cluster-hosts"
        cluster.hostfile.write_text("".join(f"{h.address} slots={slots} python=/opt/fiber/bin/python\n"
                                            for h in cluster.hosts))
    except BaseException:
        if cluster is not None:
            cluster.remove()
        remove_states()
        raise
    remove = cluster.remove

    def remove_all() -> None:
        remove()
        remove_states()

    cluster.remove = remove_all
    return cluster
