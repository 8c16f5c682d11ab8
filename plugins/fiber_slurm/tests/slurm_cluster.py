"""A real one-node Slurm on this machine for the tests: munged, slurmctld and slurmd from
Debian's slurm-wlm and munge, state in a temporary directory, ports chosen free, the node
declaring 8 CPUs (SlurmdParameters=config_overrides), stopped by the PIDs recorded."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CONF = """ClusterName=fibertest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={state}/run/munge.sock
CredType=cred/munge
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/spool
SlurmctldPidFile={state}/run/slurmctld.pid
SlurmdPidFile={state}/run/slurmd.pid
SlurmctldLogFile={state}/log/slurmctld.log
SlurmdLogFile={state}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=600
DefMemPerCPU=256
MpiDefault=none
SlurmdParameters=config_overrides
KillWait=5
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
NodeName=localhost NodeAddr=127.0.0.1 CPUs=8 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def conf_in_env(conf: Path) -> Iterator[Path]:
    """``SLURM_CONF`` set to ``conf`` meanwhile (the master's sbatch, and jobs that start jobs)."""
    saved = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield conf
    finally:
        if saved is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved


def problem() -> str | None:
    """Why no Slurm can be started here, or None."""
    for tool in ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            return f"{tool} is missing: apt-get install slurm-wlm munge (scripts/test does it as root on Debian)"
    if os.geteuid() != 0:
        return "the test Slurm's daemons run as root (SlurmUser=root)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def up(state: Path) -> Path:
    """Start the daemons; return the slurm.conf path once the node is idle."""
    for sub in ("run", "log", "ctld", "spool"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    key = state / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    subprocess.run(["/usr/sbin/munged", "--force", f"--socket={state}/run/munge.sock", f"--key-file={key}",
                    f"--pid-file={state}/run/munged.pid", f"--log-file={state}/log/munged.log",
                    f"--seed-file={state}/run/munge.seed"], check=True)
    conf = state / "slurm.conf"
    conf.write_text(CONF.format(state=state, ctld_port=_free_port(), slurmd_port=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    subprocess.run(["/usr/sbin/slurmctld", "-f", str(conf)], check=True, env=env)
    subprocess.run(["/usr/sbin/slurmd", "-f", str(conf)], check=True, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env).stdout.strip()
        if out == "idle":
            return conf
        time.sleep(0.3)
    logs = "".join((state / "log" / f).read_text()[-1500:] for f in ("slurmctld.log", "slurmd.log"))
    down(state)
    raise RuntimeError(f"the test Slurm did not become idle:\n{logs}")


def down(state: Path) -> None:
    """Stop each daemon by the PID it recorded."""
    for name in ("slurmd", "slurmctld", "munged"):
        _stop(state / "run" / f"{name}.pid")


def _stop(pid_file: Path) -> None:
    """SIGTERM to the PID in ``pid_file``; SIGKILL if it is still there 10 s later."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


# -- a multi-node Slurm on the test cluster ----------------------------------------------------

HOST_DOCKERFILE = """FROM {base}
RUN printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d \\
 && apt-get update -q \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmd slurm-client munge \\
 && rm -f /usr/sbin/policy-rc.d && rm -rf /var/lib/apt/lists/*
"""


def host_image(client: Any, worker_image: str) -> str:
    """The worker image plus Debian's slurmd, its client commands (a job starts jobs) and
    munge (the same release as this machine's slurmctld), built once per worker image and recipe."""
    from fiber_docker.testing import layered_image

    return layered_image(client, worker_image, HOST_DOCKERFILE, "fibercore-test/slurmd")


class MultiNode:
    """slurmctld (and munged) on this machine, one slurmd (and munged) on each host of a
    ``fiber_docker.cluster.Cluster``: NodeName=host1..N, NodeAddr their addresses.

    Every node sees its own state directory at the same path as this machine's (``state``),
    with the same slurm.conf and munge key: the daemons of each keep their sockets, pid
    files, logs and spool apart. ``shared`` (the jobs' spool: output and secret files) and
    each path of ``mounts`` are the same directory everywhere, as a cluster's shared file
    system. Stopped by PID here, and with the containers there (:meth:`down`)."""

    def __init__(self, state: Path, client: Any, worker_image: str, n: int, shared: Path,
                 mounts: tuple[str, ...] = ()) -> None:
        from fiber_docker.cluster import Cluster

        self.state = state
        for sub in ("run", "log", "ctld", "spool"):
            (state / sub).mkdir(parents=True, exist_ok=True)
        state.chmod(0o700)
        shared.mkdir(parents=True, exist_ok=True)
        shared.chmod(0o700)
        self.nodes = [state.parent / f"{state.name}-host{i}" for i in range(1, n + 1)]
        for node in self.nodes:
            for sub in ("run", "log", "spool"):
                (node / sub).mkdir(parents=True, exist_ok=True)
            node.chmod(0o700)
        volumes = {str(shared): {"bind": str(shared), "mode": "rw"},
                   **{path: {"bind": path, "mode": "ro"} for path in mounts}}
        self.cluster = Cluster(host_image(client, worker_image), n, client=client,
                               volumes=lambda i: {str(self.nodes[i - 1]): {"bind": str(state), "mode": "rw"},
                                                  **volumes})
        try:
            self._start()
        except BaseException:
            self.down()
            raise

    def _start(self) -> None:
        state = self.state
        key = os.urandom(1024)
        hosts = self.cluster.hosts
        text = CONF.format(state=state, ctld_port=_free_port(), slurmd_port=6818)
        text = text.replace("SlurmctldHost=localhost(127.0.0.1)",
                            f"SlurmctldHost={socket.gethostname()}({self.cluster.gateway})")
        text = text.split("NodeName=")[0] + "".join(
            f"NodeName={h.name} NodeAddr={h.address} CPUs=8 RealMemory=8000 State=UNKNOWN\n" for h in hosts)
        text += f"PartitionName=debug Nodes={','.join(h.name for h in hosts)} Default=YES MaxTime=INFINITE State=UP\n"
        for where in (state, *self.nodes):
            (where / "munge.key").write_bytes(key)
            (where / "munge.key").chmod(0o400)
            (where / "slurm.conf").write_text(text)
        munged = ["/usr/sbin/munged", "--force", f"--socket={state}/run/munge.sock", f"--key-file={state}/munge.key",
                  f"--pid-file={state}/run/munged.pid", f"--log-file={state}/log/munged.log",
                  f"--seed-file={state}/run/munge.seed"]
        conf = str(state / "slurm.conf")
        subprocess.run(munged, check=True)
        subprocess.run(["/usr/sbin/slurmctld", "-f", conf], check=True, env={**os.environ, "SLURM_CONF": conf})
        for host in hosts:  # each node's own munged and slurmd, in its own namespaces
            self.cluster.exec(host, munged)
            self.cluster.exec(host, ["/usr/sbin/slurmd", "-f", conf, "-N", host.name])
        self.conf = state / "slurm.conf"
        env = {**os.environ, "SLURM_CONF": conf}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=env).stdout
            if out.split() == ["idle"] * len(hosts):
                return
            time.sleep(0.3)
        logs = (state / "log" / "slurmctld.log").read_text()[-2000:]
        for node in self.nodes:
            if (node / "log" / "slurmd.log").exists():
                logs += (node / "log" / "slurmd.log").read_text()[-800:]
        raise RuntimeError(f"the multi-node test Slurm did not become idle ({out.split()}):\n{logs}")

    def down(self) -> None:
        """slurmctld and munged here by their PIDs; the nodes' daemons go with their containers."""
        for name in ("slurmctld", "munged"):
            _stop(self.state / "run" / f"{name}.pid")
        self.cluster.remove()
        for node in self.nodes:
            shutil.rmtree(node, ignore_errors=True)
