"""What every worker of a host reads, on the real 4-host cluster (fiber-ssh over the cluster's
own bridge network): a ``shared()`` table and each ParameterServer version cross the network
once per host, whatever the number of workers there, counted by the master's side.

Each test prints what it measured (``-s`` shows it): docs/cluster.md quotes these figures.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import fibercore as fc
from fibercore.testing.targets import ps_rounds, read_shared

#: Workers per host (the hostfile gives each host 8 slots).
PER_HOST = 8


def test_a_shared_table_crosses_to_each_host_once(on_cluster: Any) -> None:
    cluster = on_cluster
    n = PER_HOST * len(cluster.hosts)
    table = fc.shared(np.arange(25_000_000, dtype=np.float32))  # 100 MB
    with fc.Pool(n) as pool:
        assert pool.wait_until_workers_up(300)
        t0 = time.monotonic()
        got = pool.starmap(read_shared, [(table, 97 * i) for i in range(4 * n)], chunksize=1)
        took = time.monotonic() - t0
    assert [value for _m, _p, value in got] == [float(97 * i) for i in range(4 * n)]
    machines = {m for m, _p, _v in got}
    readers = {(m, p) for m, p, _v in got}
    stats = table.stats()
    size = table.nbytes
    print(f"\nshared(): {size / 1e6:.0f} MB read by {len(readers)} workers on {len(machines)} hosts in {took:.1f} s; "
          f"the master sent {stats['bytes_served'] / 1e6:.0f} MB in {stats['reads']} reads "
          f"({stats['bytes_served'] / size:.2f} x the table)")
    assert len(machines) == len(cluster.hosts), machines
    per_host = {m: sum(1 for r in readers if r[0] == m) for m in machines}
    assert min(per_host.values()) >= 2, per_host  # several readers on each host, one copy there
    # Once per host: the first reader there copies it into the host's /dev/shm, the others map it.
    assert len(machines) * (size - 16) <= stats["bytes_served"] <= len(machines) * size, stats


def test_each_parameter_version_crosses_to_each_host_once(on_cluster: Any) -> None:
    cluster = on_cluster
    per_host, rounds = 4, 5
    n = per_host * len(cluster.hosts)
    w = np.zeros(2_000_000, dtype=np.float32)  # 8 MB
    ps = fc.ParameterServer({"w": w}, staleness=0, lr=0.5, workers=n)
    out = fc.Queue()
    procs = [fc.Process(target=ps_rounds, args=(ps, rounds, 0.0, out)) for _ in range(n)]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    seen = [out.get(timeout=300) for _ in procs]
    took = time.monotonic() - t0
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * n
    machines = {m for pulls in seen for m, _v, _w0 in pulls}
    assert len(machines) == len(cluster.hosts), machines
    for pulls in seen:  # every worker read every version whole (no torn read), in order
        assert [(v, w0) for _m, v, w0 in pulls] == [(v, -0.5 * v) for v in range(rounds)], pulls
    stats = ps.stats()
    print(f"\nParameterServer: {w.nbytes / 1e6:.0f} MB parameters, {n} workers on {len(machines)} hosts, {rounds} "
          f"versions in {took:.1f} s; the master sent {stats['relayed_bytes'] / 1e6:.0f} MB in "
          f"{stats['host_fetches']} fetches (one per host per version; {n * rounds * w.nbytes / 1e6:.0f} MB "
          f"without the relay); {stats}")
    assert stats.get("pulled_bytes", 0) == 0, stats
    assert stats["host_fetches"] == len(machines) * rounds, stats
    assert stats["relayed_bytes"] == len(machines) * rounds * w.nbytes, stats
