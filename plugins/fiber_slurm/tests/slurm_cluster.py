"""A real one-node Slurm on this machine for the tests: munged, slurmctld and slurmd from
Debian's slurm-wlm and munge, state in a temporary directory, ports chosen free, the node
declaring 8 CPUs (SlurmdParameters=config_overrides), stopped by the PIDs recorded."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

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
        pid_file = state / "run" / f"{name}.pid"
        try:
            pid = int(pid_file.read_text().strip())
        except (OSError, ValueError):
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        for _ in range(100):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
