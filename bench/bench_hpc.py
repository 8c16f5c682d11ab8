"""Slurm and SSH backends vs the local backend (and multiprocessing), side by side in one run.

    sudo .venv/bin/python bench/bench_hpc.py            # starts its own Slurm and sshd
    python bench/bench_hpc.py --rounds 5

Starts a throwaway one-node Slurm (munged, slurmctld, slurmd from Debian's slurm-wlm, as the
fiber-slurm tests do) and an sshd on 127.0.0.1 with keys made for this run, and stops them by
their PIDs at the end. Needs root (the test Slurm runs as SlurmUser=root).

Rows (issue "fiber-slurm and fiber-ssh"; ratio = backend / local):
  Pool(8) to first result          the pool created, one task's result back
  Pool(8), 8 tasks of 0.2 s each   until every worker has run one (all 8 jobs started)

A benchmark, not a test: nothing asserts. Medians of --rounds runs.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "plugins" / "fiber_slurm" / "tests"))
sys.path.insert(0, str(HERE.parent / "plugins" / "fiber_ssh" / "tests"))
import _tasks  # noqa: E402

import fibercore  # noqa: E402


def first_result(lib: object, n: int) -> float:
    t0 = time.perf_counter()
    pool = lib.Pool(n)  # type: ignore[attr-defined]
    pool.apply(_tasks.noop, (1,))
    elapsed = time.perf_counter() - t0
    pool.terminate()
    pool.join()
    return elapsed


def all_workers(lib: object, n: int) -> float:
    t0 = time.perf_counter()
    pool = lib.Pool(n)  # type: ignore[attr-defined]
    pool.map(_tasks.sleep_for, [0.2] * n, chunksize=1)
    elapsed = time.perf_counter() - t0
    pool.terminate()
    pool.join()
    return elapsed


def median_of(rounds: int, fn, *args) -> float:  # type: ignore[no-untyped-def]
    return statistics.median(fn(*args) for _ in range(rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=8, help="pool size (default 8)")
    args = parser.parse_args()
    import slurm_cluster
    import sshd

    for why in (slurm_cluster.problem(), sshd.problem()):
        if why:
            sys.exit(f"bench_hpc: {why}")
    state = Path(tempfile.mkdtemp(prefix="fiber-bench-hpc-"))
    keys = state / "client"
    keys.mkdir()
    public = sshd.keygen(keys / "id_ed25519")
    server = sshd.Sshd(state / "sshd", public)
    (keys / "known_hosts").write_text(server.known_hosts_line() + "\n")
    conf = slurm_cluster.up(state / "slurm")
    os.environ["SLURM_CONF"] = str(conf)
    backends = {
        "local": {},
        "slurm": {"slurm_spool_dir": str(state / "spool"), "slurm_poll_interval": 0.1},
        "ssh": {"ssh_hosts": f"127.0.0.1:{args.n}", "ssh_port": server.port,
                "ssh_identity": str(keys / "id_ed25519"),
                "ssh_options": f"-o StrictHostKeyChecking=yes -o UserKnownHostsFile={keys / 'known_hosts'}"},
    }
    rows: dict[str, dict[str, float]] = {}
    try:
        for name, config in backends.items():
            fibercore.init(backend=name, listen_host="127.0.0.1", **config)
            first_result(fibercore, args.n)  # warm-up: connections, the backend's engine
            rows[name] = {"first": median_of(args.rounds, first_result, fibercore, args.n),
                          "all": median_of(args.rounds, all_workers, fibercore, args.n)}
            print(f"  {name:<6} first result {rows[name]['first']:.3f} s, all {args.n} workers "
                  f"{rows[name]['all']:.3f} s", flush=True)
        fibercore.init()
        spawn = multiprocessing.get_context("spawn")
        rows["multiprocessing"] = {"first": median_of(args.rounds, first_result, spawn, args.n),
                                   "all": median_of(args.rounds, all_workers, spawn, args.n)}
    finally:
        fibercore.init()
        slurm_cluster.down(state / "slurm")
        server.stop()
    local = rows["local"]
    print(f"\n| Pool({args.n}) | to first result | ratio to local | {args.n} tasks of 0.2 s | ratio to local |")
    print("|---|---|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {row['first']:.3f} s | {row['first'] / local['first']:.2f} | {row['all']:.3f} s | "
              f"{row['all'] / local['all']:.2f} |")


if __name__ == "__main__":
    main()
