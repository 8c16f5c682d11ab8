"""Kubernetes backend benchmark: Pool(N) to the first result on a cluster vs the docker
backend, side by side in one run (ratio = kubernetes / docker).

    python bench/bench_k8s.py --kubeconfig /tmp/fibercore-k8s/kubeconfig --image IMG
    python bench/bench_k8s.py --up --image IMG     # bring up the test cluster (as root), then measure

The image must be on the node's dockerd (``imagePullPolicy: Never``); the test image
(``docker images fibercore-test/worker``) works. Pods use host networking, as in the tests.
A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

import fibercore
from fibercore.testing.targets import triple  # in the image: pods do not see this checkout

CLUSTER = Path(__file__).resolve().parents[1] / "plugins" / "fiber_k8s" / "tests" / "cluster"


def first_result(n: int) -> tuple[float, float]:
    """Seconds from Pool(n) to the first result, and until all n workers are ready."""
    t0 = time.perf_counter()
    pool = fibercore.Pool(n)
    try:
        pool.apply(triple, (1,))
        first = time.perf_counter() - t0
        while pool._core.ready_count() < n:
            time.sleep(0.005)
        ready = time.perf_counter() - t0
    finally:
        pool.terminate()
        pool.join()
    return first, ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubeconfig", default=os.environ.get("FIBER_K8S_KUBECONFIG"))
    parser.add_argument("--up", action="store_true", help="start the test cluster (tests/cluster/up.sh) for the run")
    parser.add_argument("--image", default=os.environ.get("FIBER_IMAGE", "fibercore-worker:latest"))
    parser.add_argument("--sizes", default="1,8")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    state = None
    if args.up:
        state = tempfile.mkdtemp(prefix="fiber-bench-k8s-")
        args.kubeconfig = subprocess.run([str(CLUSTER / "up.sh"), state], check=True, capture_output=True,
                                         text=True).stdout.strip().splitlines()[-1]
    if not args.kubeconfig:
        parser.error("give --kubeconfig (or FIBER_K8S_KUBECONFIG), or --up")
    configs = {
        "kubernetes": {"k8s_kubeconfig": args.kubeconfig, "k8s_host_network": True, "k8s_image_pull_policy": "Never",
                       "listen_host": "127.0.0.1", "k8s_job_listen_host": "127.0.0.1"},
        "docker": {"docker_echo_output": False},
    }
    rows = []
    try:
        print(f"bench_k8s on {os.cpu_count()} CPUs, image {args.image}", flush=True)
        for n in (int(s) for s in args.sizes.split(",")):
            got = {}
            for backend, extra in configs.items():
                runs = []
                for _ in range(args.repeat):
                    fibercore.init(backend=backend, image=args.image, **extra)
                    runs.append(first_result(n))
                runs.sort()
                got[backend] = runs[len(runs) // 2]
            for i, what in enumerate(("to first result", "all workers ready")):
                k, d = got["kubernetes"][i], got["docker"][i]
                rows.append((f"Pool({n}) {what}", k, d))
                print(f"  Pool({n}) {what:<18} kubernetes {k:7.3f} s  docker {d:7.3f} s  ratio "
                      f"{k / d:5.2f}", flush=True)
    finally:
        fibercore.init()
        if state:
            subprocess.run([str(CLUSTER / "down.sh"), state], check=False)
    print("\n| measurement | kubernetes | docker | ratio |\n|---|---|---|---|")
    for name, k, d in rows:
        print(f"| {name} | {k:.3g} s | {d:.3g} s | {k / d:.2f} |")


if __name__ == "__main__":
    main()
