"""A Pool on a real 4-host cluster (fiber_docker.cluster: containers on their own bridge
network, sshd on each) while the network fails: a host cut off, frozen, losing packets,
the master cut off from every host. The bound is ``heartbeat_timeout`` (4 s here): a host
silent longer is declared lost, its tasks rerun elsewhere, every result arrives once and
in order; a shorter silence costs nothing; a cut-off job ends by itself.

Each test prints what it measured (``-s`` shows it): docs/cluster.md quotes these figures.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from cluster_helpers import BOUND, MARGIN, host_of, hosts_of, wait_for, worker_pids

import fibercore as fc
from fibercore.testing.targets import echo_pipe, ps_rounds, queue_echo, triple_after


def start_map(pool: Any, n: int, delay: float) -> Any:
    """A map of ``n`` tasks of ``delay`` s, once every worker is up."""
    assert pool.wait_until_workers_up(120)
    return pool.starmap_async(triple_after, [(i, delay) for i in range(n)], chunksize=1)


def busiest(pool: Any, cluster: Any) -> Any:
    """The host with most of the pool's workers (a host marked down a moment ago by fiber-ssh
    may have none)."""
    address, _ = hosts_of(pool).most_common(1)[0]
    return next(h for h in cluster.hosts if h.address == address)


def test_a_partitioned_host_is_declared_lost_its_tasks_rerun_once(on_cluster: Any) -> None:
    cluster = on_cluster
    with fc.Pool(2 * len(cluster.hosts)) as pool:
        expected = [3 * i for i in range(240)]
        quiet = start_map(pool, 240, 0.05)
        t0 = time.monotonic()
        assert quiet.get(120) == expected
        quiet_time = time.monotonic() - t0
        result = start_map(pool, 240, 0.05)
        time.sleep(0.5)  # mid-map: the victim's workers hold tasks
        victim = busiest(pool, cluster)
        on_victim = hosts_of(pool)[victim.address]
        stale = worker_pids(cluster, victim)
        t0 = time.monotonic()
        cluster.partition(victim)
        lost_after = wait_for(lambda: pool.stats["replaced_workers"] >= on_victim, BOUND + MARGIN,
                              f"{on_victim} workers of the partitioned host declared lost")
        assert result.get(120) == expected  # every result once, in order
        faulty_time = time.monotonic() - t0
        stats = pool.stats
        assert stats["retried_chunks"] >= 1, stats
        # A replacement may be tried there before ssh itself gives up on the host; it never
        # starts there and is placed on another host.
        wait_for(lambda: victim.address not in hosts_of(pool), BOUND + MARGIN, "no worker left on the cut-off host")
        # Back on the network, its stale jobs find their master gone and end by themselves.
        cluster.heal(victim)
        ended_after = wait_for(lambda: not set(stale) & set(worker_pids(cluster, victim)), BOUND + MARGIN,
                               "stale jobs ended")
    print(f"\npartition: lost after {lost_after:.1f} s (bound {BOUND} s); map {faulty_time:.1f} s with the fault, "
          f"{quiet_time:.1f} s without; stale jobs gone {ended_after:.1f} s after the heal; {stats}")
    assert lost_after >= BOUND * 0.75, f"declared lost after {lost_after:.1f} s, before the bound ({BOUND} s)"


def test_a_short_partition_costs_nothing(on_cluster: Any) -> None:
    cluster = on_cluster
    with fc.Pool(2 * len(cluster.hosts)) as pool:
        result = start_map(pool, 160, 0.05)
        time.sleep(0.5)
        with cluster.partitioned(busiest(pool, cluster)):
            time.sleep(BOUND / 3)
        assert result.get(120) == [3 * i for i in range(160)]
        stats = pool.stats
    print(f"\nshort partition ({BOUND / 3:.1f} s): {stats}")
    assert stats["replaced_workers"] == 0 and stats["retried_chunks"] == 0, stats


def test_five_percent_packet_loss_completes_and_loses_no_worker(on_cluster: Any) -> None:
    cluster = on_cluster
    with fc.Pool(2 * len(cluster.hosts)) as pool:
        result = start_map(pool, 160, 0.05)
        victim = busiest(pool, cluster)
        cluster.drop_packets(victim, 0.05)
        t0 = time.monotonic()
        try:
            assert result.get(120) == [3 * i for i in range(160)]
        finally:
            cluster.heal(victim)
        lossy_time = time.monotonic() - t0
        stats = pool.stats
    print(f"\n5% loss: map {lossy_time:.1f} s; {stats}")
    assert stats["replaced_workers"] == 0, stats


def test_a_frozen_host_is_declared_lost_and_its_jobs_end_when_it_thaws(on_cluster: Any) -> None:
    cluster = on_cluster
    with fc.Pool(2 * len(cluster.hosts)) as pool:
        result = start_map(pool, 240, 0.05)
        time.sleep(0.5)
        victim = busiest(pool, cluster)
        on_victim = hosts_of(pool)[victim.address]
        stale = worker_pids(cluster, victim)  # (a replacement may start there after the thaw)
        with cluster.frozen(victim):
            lost_after = wait_for(lambda: pool.stats["replaced_workers"] >= on_victim, BOUND + MARGIN,
                                  "workers of the frozen host declared lost")
            assert result.get(120) == [3 * i for i in range(240)]
        ended_after = wait_for(lambda: not set(stale) & set(worker_pids(cluster, victim)), BOUND + MARGIN,
                               "stale jobs ended")
        stats = pool.stats
    print(f"\nfreeze: lost after {lost_after:.1f} s; stale jobs gone {ended_after:.1f} s after the thaw; {stats}")


def test_a_master_cut_off_from_every_host_leaves_no_job_running(on_cluster: Any) -> None:
    cluster = on_cluster
    pool = fc.Pool(2 * len(cluster.hosts))
    try:
        result = start_map(pool, 400, 0.05)
        time.sleep(0.5)
        for host in cluster.hosts:
            cluster.partition(host)
        ended_after = wait_for(lambda: not any(worker_pids(cluster, h) for h in cluster.hosts), BOUND + MARGIN,
                               "every job on every host ended")
        for host in cluster.hosts:
            cluster.heal(host)
        # The partition healed: the pool starts workers again and the map ends, each result once.
        assert result.get(180) == [3 * i for i in range(400)]
        stats = pool.stats
    finally:
        pool.terminate()
        pool.join()
    print(f"\nmaster cut off: every job gone {ended_after:.1f} s after the cut; {stats}")


def test_a_pipe_to_a_cut_off_host_raises_within_the_bound(on_cluster: Any) -> None:
    """Both ends alive, the network between them gone: the master's end does not wait for
    ever (its connection closes after the bound), and the job is declared lost (-9)."""
    cluster = on_cluster
    here, there = fc.Pipe()
    p = fc.Process(target=echo_pipe, args=(there,))
    p.start()
    here.send("ping")
    assert here.recv() == "ping"  # connected, across hosts
    victim = next(h for h in cluster.hosts if h.address == p.job.data.host.name)
    cluster.partition(victim)
    t0 = time.monotonic()
    assert here.poll(BOUND + MARGIN), "the pipe's end still waits after the bound"
    with pytest.raises((EOFError, OSError)):
        here.recv()
    closed_after = time.monotonic() - t0
    p.join(BOUND + MARGIN)
    lost_after = time.monotonic() - t0
    assert p.exitcode == -9, p.exitcode
    print(f"\npipe across a partition: EOFError after {closed_after:.1f} s, job declared lost after "
          f"{lost_after:.1f} s (bound {BOUND} s)")


def test_a_parameter_server_round_does_not_wait_for_a_cut_off_worker(on_cluster: Any) -> None:
    """BSP rounds with two workers per host; one host cut off: once its workers are declared
    lost the round closes without them, and the others go on."""
    cluster = on_cluster
    n = 2 * len(cluster.hosts)
    ps = fc.ParameterServer({"w": np.zeros(4)}, staleness=0, lr=0.5, workers=n)
    procs = [fc.Process(target=ps_rounds, args=(ps, 100_000, 0.02)) for _ in range(n)]
    for p in procs:
        p.start()
    wait_for(lambda: ps.version >= 5, 120, "the first rounds")
    victim = host_of(cluster, procs[0])
    on_victim = [p for p in procs if host_of(cluster, p) is victim]
    stale = worker_pids(cluster, victim)
    cluster.partition(victim)
    cut_at = ps.version
    lost_after = wait_for(lambda: ps.stats().get("members_lost", 0) >= len(on_victim), BOUND + MARGIN,
                          f"the {len(on_victim)} cut-off workers dropped from the rounds")
    going_after = wait_for(lambda: ps.version >= cut_at + 5, 60, "rounds going on without the cut-off workers")
    for p in on_victim:
        p.join(BOUND + MARGIN)
        assert p.exitcode == -9, p.exitcode
    cluster.heal(victim)
    ended_after = wait_for(lambda: not set(stale) & set(worker_pids(cluster, victim)), BOUND + MARGIN,
                           "stale jobs ended")
    print(f"\nParameterServer across a partition: {len(on_victim)} workers dropped after {lost_after:.1f} s, "
          f"5 more versions after {going_after:.1f} s; stale jobs gone {ended_after:.1f} s after the heal; "
          f"{ps.stats()}")


def test_a_queue_consumer_cut_off_is_declared_lost_and_nothing_put_is_lost(on_cluster: Any) -> None:
    """A consumer on a cut-off host: it is declared lost; what is put meanwhile is taken by a
    new consumer elsewhere (the queue lives in the master, its puts never wait for a peer)."""
    cluster = on_cluster
    inbox, outbox = fc.Queue(), fc.Queue()
    first = fc.Process(target=queue_echo, args=(inbox, outbox))
    first.start()
    inbox.put(1)
    assert outbox.get(timeout=120) == 1
    # Item 1 is acknowledged (its reader told the queue it consumed it) before the cut: a
    # reader lost within QUIET (50 ms) of a get has that item handed out again (docs/cluster.md).
    wait_for(lambda: inbox.qsize() == 0, 60, "item 1 acknowledged")
    victim = host_of(cluster, first)
    cluster.partition(victim)
    t0 = time.monotonic()
    for i in range(2, 6):
        inbox.put(i)
    first.join(BOUND + MARGIN)
    lost_after = time.monotonic() - t0
    assert first.exitcode == -9, first.exitcode
    second = fc.Process(target=queue_echo, args=(inbox, outbox))
    second.start()
    assert host_of(cluster, second) is not victim
    got = sorted(outbox.get(timeout=120) for _ in range(4))
    all_after = time.monotonic() - t0
    inbox.put(None)
    second.join(60)
    assert outbox.empty() and inbox.empty()  # each item once: none came twice, none is left
    cluster.heal(victim)
    print(f"\nQueue across a partition: consumer declared lost after {lost_after:.1f} s; its successor took {got}, "
          f"all of them {all_after:.1f} s after the cut")
    assert got == [2, 3, 4, 5]


def test_a_manager_cut_off_raises_within_the_bound(on_cluster: Any) -> None:
    """The manager's server on a cut-off host: a proxy call raises within the bound, never hangs."""
    cluster = on_cluster
    manager = fc.Manager()  # started: its server is a job on one of the hosts
    try:
        d = manager.dict()
        d["a"] = 1
        victim = host_of(cluster, manager._process)
        cluster.partition(victim)
        t0 = time.monotonic()
        with pytest.raises(fc.ProcessError, match="declared lost") as raised:
            for i in range(1000):
                d[f"k{i}"] = i
                time.sleep(0.01)
        raised_after = time.monotonic() - t0
        cluster.heal(victim)
    finally:
        manager._process.kill()
        manager._process.join(30)
    print(f"\nManager across a partition: {type(raised.value).__name__} after {raised_after:.1f} s: {raised.value}")
    assert raised_after <= BOUND + MARGIN
