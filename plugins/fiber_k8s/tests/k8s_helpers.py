"""Constants and helpers of the k8s tests (conftest.py names clash across test folders)."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[2]
CLUSTER = HERE / "cluster"
RUN_ID = uuid.uuid4().hex[:12]
RUN_LABEL = f"fiber-test-run={RUN_ID}"
VERSION = "1.20.2"


def binaries_dir() -> Path:
    return Path(os.environ.get("FIBER_K8S_CACHE", "/var/cache/fibercore-k8s")) / VERSION / "bin"


def cluster_problem() -> str | None:
    """Why no cluster can be brought up here, or None."""
    if os.environ.get("FIBER_K8S_KUBECONFIG"):
        return None
    missing = [b for b in ("kube-apiserver", "kubelet", "kube-scheduler", "kube-controller-manager")
               if not (binaries_dir() / b).exists()]
    if missing:
        return (f"no Kubernetes binaries in {binaries_dir()} ({', '.join(missing)} missing): run "
                f"{CLUSTER / 'build.sh'} as root on Debian (~6 min; scripts/test does it)")
    if os.geteuid() != 0:
        return "the test cluster's kubelet needs root"
    for tool in ("etcd", "gcc", "openssl", "curl", "jq", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install etcd-server gcc openssl curl jq)"
    return None


def up(state: Path) -> Path:
    done = subprocess.run([str(CLUSTER / "up.sh"), str(state)], capture_output=True, text=True, timeout=170)
    if done.returncode != 0:
        logs = "".join(f"\n--- {p.name}\n{p.read_text()[-1500:]}" for p in sorted((state / "logs").glob("*.log")))
        raise RuntimeError(f"the test cluster did not come up:\n{done.stderr[-2000:]}{logs}")
    return Path(done.stdout.strip().splitlines()[-1])


def down(state: Path) -> None:
    subprocess.run([str(CLUSTER / "down.sh"), str(state)], capture_output=True, text=True, timeout=120)
