"""A multi-host test cluster on one machine: N containers on a bridge network of their own.

Each host has its own hostname, address, network namespace, ``/dev/shm`` and processes:
another machine to fibercore. The tests start it, inject faults into it and remove it::

    with Cluster(image, 4, command=[...]) as cluster:
        with cluster.partitioned(cluster.hosts[1]):   # no packet in or out for a while
            ...
        cluster.drop_packets(cluster.hosts[2], 0.05)  # 5% of its packets lost, both ways
        cluster.freeze(cluster.hosts[3])              # docker pause: alive to the kernel, silent
        cluster.kill(cluster.hosts[0])                # every process on it dies at once

Faults are iptables rules in the host's own network namespace (entered with ``nsenter``
as root), on its ``eth0`` only, so they leave with the container and never touch this
machine's rules. This kernel has no ``netem``: latency cannot be shaped, only packets
dropped. Everything is labelled ``fibercore-test-cluster``: removed by ID at the end,
and a cluster whose creating process died is swept by label when the next one starts.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

#: The label on every network and container of a test cluster (its value: the cluster's tag).
LABEL = "fibercore-test-cluster"
#: The pid of the process that made it (swept once that process is gone).
OWNER = "fibercore-test-cluster-owner"


@dataclass
class Host:
    """One host: its name (also its hostname), address on the cluster's network, container."""

    name: str
    address: str
    container: Any

    @property
    def pid(self) -> int:
        """The PID (in this machine's namespace) of the host's first process: its namespaces."""
        self.container.reload()
        return int(self.container.attrs["State"]["Pid"])


def cluster_problem() -> str | None:
    """Why no test cluster can run here, or None."""
    if os.geteuid() != 0:
        return "the test cluster injects faults with iptables in each host's namespace: run as root"
    for tool in ("iptables", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install iptables util-linux)"
    return None


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def sweep_stale(client: Any) -> int:
    """Remove the containers and networks of test clusters whose creating process is gone
    (a run killed before its clean-up); returns how many were removed."""
    removed = 0
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        owner = container.labels.get(OWNER, "")
        if owner.isdigit() and not _alive(int(owner)):
            container.remove(force=True)
            removed += 1
    for network in client.networks.list(filters={"label": LABEL}):
        owner = network.attrs.get("Labels", {}).get(OWNER, "")
        if owner.isdigit() and not _alive(int(owner)):
            with contextlib.suppress(Exception):
                network.remove()
                removed += 1
    return removed


class Cluster:
    """N hosts as containers of ``image`` on a new bridge network.

    ``command`` is each host's main process (default: sleep forever); ``volumes(i)`` the
    docker volumes of host ``i`` (1-based), e.g. an sshd configuration per host; ``shm_size``
    each host's ``/dev/shm`` (Docker's default, 64 MB, holds no large shared object: a
    machine's processes would each read their own copy).
    """

    def __init__(self, image: str, n: int = 4, *, command: list[str] | None = None,
                 volumes: Callable[[int], dict[str, Any]] | None = None, client: Any = None,
                 ready: Callable[[Host], bool] | None = None, ready_timeout: float = 60.0,
                 shm_size: str = "1g") -> None:
        import docker

        if n < 1:
            raise ValueError("a cluster needs at least one host")
        self.client = client or docker.from_env()
        sweep_stale(self.client)
        self.tag = secrets.token_hex(4)
        labels = {LABEL: self.tag, OWNER: str(os.getpid())}
        self.hosts: list[Host] = []
        self._rules: list[tuple[Host, list[str]]] = []
        self.network = self.client.networks.create(f"fibercore-cluster-{self.tag}", driver="bridge",
                                                   labels=labels)
        try:
            self.network.reload()
            self.gateway: str = self.network.attrs["IPAM"]["Config"][0]["Gateway"]
            for i in range(1, n + 1):
                name = f"host{i}"
                container = self.client.containers.run(
                    image, command or ["sleep", "infinity"], detach=True, init=True, hostname=name,
                    name=f"fibercore-cluster-{self.tag}-{name}", labels=labels, network=self.network.name,
                    volumes=volumes(i) if volumes else None, shm_size=shm_size)
                self.hosts.append(Host(name, self._address(container), container))
            for host in self.hosts:
                self._wait_ready(host, ready, ready_timeout)
        except BaseException:
            self.remove()
            raise

    def _address(self, container: Any) -> str:
        for _ in range(100):
            container.reload()
            net = container.attrs["NetworkSettings"]["Networks"].get(self.network.name) or {}
            if net.get("IPAddress"):
                return str(net["IPAddress"])
            time.sleep(0.05)
        raise RuntimeError(f"container {container.name} got no address on {self.network.name}")

    def _wait_ready(self, host: Host, ready: Callable[[Host], bool] | None, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            host.container.reload()
            if host.container.status == "exited":
                raise RuntimeError(f"{host.name} exited: {host.container.logs()[-2000:]!r}")
            if host.container.status == "running" and (ready is None or ready(host)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{host.name} was not ready within {timeout:.0f} s: "
                                   f"{host.container.logs()[-2000:]!r}")
            time.sleep(0.1)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def host(self, name: str) -> Host:
        return next(h for h in self.hosts if h.name == name)

    def exec(self, host: Host, argv: list[str], user: str = "root") -> str:
        """Run ``argv`` on ``host``; its output (raises when it fails)."""
        code, out = host.container.exec_run(argv, user=user)
        text = out.decode("utf-8", "replace")
        if code != 0:
            raise RuntimeError(f"{host.name}: {argv} failed (exit {code}): {text[-2000:]}")
        return text

    # -- faults --------------------------------------------------------------------------------
    def _iptables(self, host: Host, action: str, rule: list[str]) -> None:
        argv = ["nsenter", "-t", str(host.pid), "-n", "iptables", "-w", action, *rule]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")

    def _add(self, host: Host, rules: list[list[str]]) -> None:
        for rule in rules:
            self._iptables(host, "-I", rule)
            self._rules.append((host, rule))

    def _remove_rules(self, host: Host) -> None:
        for owner, rule in [r for r in self._rules if r[0] is host]:
            self._rules.remove((owner, rule))
            with contextlib.suppress(RuntimeError):  # a killed host took its rules with it
                self._iptables(host, "-D", rule)

    def partition(self, host: Host) -> None:
        """Cut ``host`` off: every packet into or out of its network interface is dropped,
        silently (no reset, no ICMP), as a pulled cable or a failed switch port."""
        tag = ["-m", "comment", "--comment", f"fibercore-cluster-{self.tag}"]
        self._add(host, [["INPUT", "-i", "eth0", *tag, "-j", "DROP"], ["OUTPUT", "-o", "eth0", *tag, "-j", "DROP"]])

    def drop_packets(self, host: Host, fraction: float) -> None:
        """Drop ``fraction`` of the packets into and out of ``host``, at random."""
        if not 0 < fraction < 1:
            raise ValueError("fraction must be between 0 and 1")
        loss = ["-m", "statistic", "--mode", "random", "--probability", f"{fraction:.4f}",
                "-m", "comment", "--comment", f"fibercore-cluster-{self.tag}"]
        self._add(host, [["INPUT", "-i", "eth0", *loss, "-j", "DROP"], ["OUTPUT", "-o", "eth0", *loss, "-j", "DROP"]])

    def heal(self, host: Host) -> None:
        """Remove every rule a fault put on ``host``."""
        self._remove_rules(host)

    def freeze(self, host: Host) -> None:
        """``docker pause``: its processes stop; its kernel still answers TCP (a stalled host)."""
        host.container.pause()

    def thaw(self, host: Host) -> None:
        host.container.unpause()

    def kill(self, host: Host) -> None:
        """SIGKILL to every process on ``host`` at once (a crashed machine)."""
        host.container.kill()

    @contextlib.contextmanager
    def _during(self, host: Host, begin: Callable[[Host], None], end: Callable[[Host], None]) -> Iterator[Host]:
        begin(host)
        try:
            yield host
        finally:
            end(host)

    def partitioned(self, host: Host) -> contextlib.AbstractContextManager[Host]:
        """``with cluster.partitioned(host):`` cut off for the block."""
        return self._during(host, self.partition, self.heal)

    def frozen(self, host: Host) -> contextlib.AbstractContextManager[Host]:
        """``with cluster.frozen(host):`` paused for the block."""
        return self._during(host, self.freeze, self.thaw)

    # -- the end -------------------------------------------------------------------------------
    def remove(self) -> None:
        """Remove every host (by ID, then any left by label) and the network."""
        for host in self.hosts:
            with contextlib.suppress(Exception):
                host.container.reload()
                if host.container.status == "paused":
                    host.container.unpause()
            with contextlib.suppress(Exception):
                host.container.remove(force=True)
        for container in self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.tag}"}):
            with contextlib.suppress(Exception):
                container.remove(force=True)
        with contextlib.suppress(Exception):
            self.network.remove()
        self.hosts = []
        self._rules = []


__all__ = ["LABEL", "Cluster", "Host", "cluster_problem", "sweep_stale"]
