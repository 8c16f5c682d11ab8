"""Beyond one machine, measured: fibercore between this machine and jobs on a multi-host
cluster, each figure beside its floor in the same run.

    python bench/bench_cluster.py                        # every section (about 15 minutes)
    python bench/bench_cluster.py --quick                # fewer rounds and generations (about 5)
    python bench/bench_cluster.py msg es                 # chosen sections only
    python bench/bench_cluster.py --report docs/perf/bench_cluster   # also STEM.md, .json and .png

The cluster is the test suite's (``fiber_docker.cluster``): N hosts (4; ``--hosts``) as
containers on a bridge network of their own, each with its own network namespace,
``/dev/shm`` and sshd; fibercore reaches them with fiber-ssh (a hostfile of the N hosts) and
the master stays on this machine, listening on the network's gateway address. The checkout
is mounted on every host at the same path, so jobs import this directory's task modules.
Needs root or the docker group, a dockerd, and the test base image (built on first use).

Sections (each measure is taken on the cluster and against its floor in the same run):
  msg     between the master and a job on another host: Pipe 100 B round trip, apply_async
          round trip on Pool(1), Queue 100 B messages/s (master to job), 1 MB and 100 MB
          sent over a Pipe (answered with one byte; send_bytes/recv_bytes, and a 100 MB array
          with send/recv, which keeps it without a copy), with frames encrypted (the default) and
          with network_encryption=False (authenticated only): against the floor, a plain
          Python TCP socket between the same two network namespaces (no authentication, no
          encryption), and against the same fibercore measure on one machine (the local
          backend)
  shared  a 100 MB ``shared()`` table read by 8 workers on each host: seconds, and the bytes
          the master sent (``Shared.stats()``) against the table's size times the hosts
  es      the paper's ES (population 2,048, a shared 100 MB noise table, 1 ms of CPU an
          evaluation) on Pool(32): the local backend, the cluster with 1 host x 32 and with
          N hosts x 8: seconds a generation, and the bytes the master sent per generation
          (the bridge's counter: every byte from this machine to the hosts)
  ppo     the PPO-style loop of bench_rl.py (8 CartPole simulators stepped over Pipes) with
          the simulators on the cluster's hosts, on this machine (local backend) and with
          multiprocessing's fork: steps/s
  sb3     (only with --sb3: the image then holds torch) stable-baselines3's
          ``SubprocVecEnv(start_method="fiber")`` with 8 envs on the hosts: env steps/s

This machine's kernel has no netem: the bridge between namespaces has no latency to shape,
so "another host" here costs what a veth pair and the TCP stack cost, and every host shares
this machine's cores (the ES rows compare placement, not added CPUs). A benchmark, not a
test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
BENCH = Path(__file__).resolve().parent
CHECKOUT = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(CHECKOUT / "plugins" / "fiber_ssh" / "tests"))  # sshd.py: the cluster's hosts
import _cluster_tasks as C  # noqa: E402
import _es_tasks as E  # noqa: E402
import _rl_tasks as R  # noqa: E402
import bench_es_scale  # noqa: E402
import numpy as np  # noqa: E402

import fibercore  # noqa: E402

#: (section, measure, unit, better, {column: value})
ROWS: list[tuple[str, str, str, str, dict[str, float]]] = []


def record(section: str, measure: str, unit: str, better: str, **values: float) -> None:
    ROWS.append((section, measure, unit, better, values))
    cells = "  ".join(f"{k} {v:.4g}" for k, v in values.items())
    print(f"  {measure:<44} {unit:<6} {cells}", flush=True)


def median_of(rounds: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(rounds))


# ------------------------------------------------------------------------------ the cluster
class Setup:
    """The cluster, its hostfiles and the fibercore settings that reach it."""

    def __init__(self, hosts: int, extra: tuple[str, ...]) -> None:
        import docker
        import sshd
        from fiber_docker.cluster import cluster_problem
        from fiber_docker.testing import docker_problem, test_image

        problem = docker_problem() or cluster_problem()
        if problem:
            raise SystemExit(f"bench_cluster: {problem}")
        self.client = docker.from_env()
        self.keys = Path(tempfile.mkdtemp(prefix="fibercore-bench-ssh-"))
        try:
            public = sshd.keygen(self.keys / "id_ed25519")
            self.known_hosts = self.keys / "known_hosts"
            print("bench_cluster: building the hosts' image (cached by content)...", flush=True)
            image = test_image(CHECKOUT, extra)
            self.cluster = sshd.start_cluster(self.client, image, hosts, self.keys, public, self.known_hosts,
                                              slots=32, mounts=(str(CHECKOUT),))
        except BaseException:
            import shutil

            shutil.rmtree(self.keys, ignore_errors=True)
            raise
        self.hosts = len(self.cluster.hosts)
        self.options = sshd.client_options(self.known_hosts)
        self.one_host = self.keys / "one-host"
        self.one_host.write_text(f"{self.cluster.hosts[0].address} slots=32 python=/opt/fiber/bin/python\n")
        self.spread = self.keys / "spread"  # 8 slots a host: a Pool(8 N) has 8 workers on each
        self.spread.write_text("".join(f"{h.address} slots=8 python=/opt/fiber/bin/python\n"
                                       for h in self.cluster.hosts))
        net = self.cluster.network
        net.reload()
        self.bridge = f"/sys/class/net/br-{net.id[:12]}/statistics/tx_bytes"

    def on_cluster(self, hostfile: Path | None = None, **extra: Any) -> None:
        fibercore.init(backend="ssh", ssh_hostfile=str(hostfile or self.cluster.hostfile),
                       ssh_identity=str(self.keys / "id_ed25519"), ssh_options=self.options,
                       listen_host=self.cluster.gateway, **extra)

    def sent(self) -> int:
        """Bytes this machine has sent into the cluster's bridge so far."""
        return int(Path(self.bridge).read_text())

    def close(self) -> None:
        import shutil

        fibercore.init(backend="local")
        self.cluster.remove()
        shutil.rmtree(self.keys, ignore_errors=True)


@contextmanager
def local() -> Iterator[None]:
    fibercore.init(backend="local")
    yield


# ------------------------------------------------------------------------------ the floor
class RawClient:
    """The floor: a plain TCP connection to ``_cluster_tasks.raw_server`` running as a job."""

    def __init__(self) -> None:
        ready = fibercore.Queue()
        self.job = fibercore.Process(target=C.raw_server, args=(ready,))
        self.job.start()
        port = ready.get(timeout=120)
        host = self.job.job.data.host.name  # the host's address on the cluster's network
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.head = struct.Struct("<cQ")

    def _recv(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise EOFError
            got += k
        return bytes(buf)

    def rtt_us(self, n: int, size: int = 100) -> float:
        payload = self.head.pack(b"e", size) + b"x" * size
        for _ in range(200):
            self.sock.sendall(payload)
            self._recv(size)
        t0 = time.perf_counter()
        for _ in range(n):
            self.sock.sendall(payload)
            self._recv(size)
        return (time.perf_counter() - t0) / n * 1e6

    def send_mb_s(self, size: int, reps: int) -> float:
        payload = memoryview(b"x" * size)
        times = []
        for _ in range(reps + 1):  # one more, as the fibercore measure's first (not timed there)
            t0 = time.perf_counter()
            self.sock.sendall(self.head.pack(b"b", size))
            self.sock.sendall(payload)
            self._recv(1)
            times.append(time.perf_counter() - t0)
        return size / statistics.median(times[1:]) / 1e6

    def messages_s(self, n: int, size: int = 100) -> float:
        """One-way 100 B messages/s: each framed (a length before it) and taken apart one by
        one by the server, all written at once (as a sender that batches), answered at the end."""
        frames = (self.head.pack(b"m", size) + b"x" * size) * n
        t0 = time.perf_counter()
        self.sock.sendall(self.head.pack(b"n", n) + frames)
        self._recv(1)
        return n / (time.perf_counter() - t0)

    def close(self) -> None:
        self.sock.sendall(self.head.pack(b"q", 0))
        self.sock.close()
        self.job.join(30)


# ------------------------------------------------------------------------------ fibercore measures
def pipe_rtt_us(n: int) -> float:
    import bench_rl

    return bench_rl.pipe_rtt(fibercore, n)


def apply_rtt_us(n: int) -> float:
    with fibercore.Pool(1) as pool:
        pool.apply(R.nothing)
        for _ in range(50):
            pool.apply_async(R.nothing).get()
        t0 = time.perf_counter()
        for _ in range(n):
            pool.apply_async(R.nothing).get()
        return (time.perf_counter() - t0) / n * 1e6


def queue_rate(n: int) -> float:
    import bench_rl

    return bench_rl.queue_rate_out(fibercore, n)


def pipe_send_mb_s(size: int, reps: int, array: bool = False) -> float:
    """MB/s of ``send_bytes`` (the receiver's ``recv_bytes`` makes its ``bytes``, as
    multiprocessing's does) or, with ``array``, of ``send`` of a float32 array (the receiver's
    ``recv`` gives the array in the frame's memory), each answered with one byte. The first
    message is not timed (nor the floor's): a new process's first large frame waits while the
    kernel finds it huge pages (up to 0.2 s for 100 MB on the development VM), later ones reuse
    what earlier ones freed; the steady state is what a training loop sees."""
    import numpy as np

    a, b = fibercore.Pipe()
    p = fibercore.Process(target=C.sink_objects if array else C.sink, args=(b, reps + 1))
    p.start()
    payload = np.ones(size // 4, dtype=np.float32) if array else b"x" * size
    send = a.send if array else a.send_bytes
    send(payload)  # the steady state: a new job's first large message waits for memory (below)
    a.recv_bytes()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        send(payload)
        a.recv_bytes()
        times.append(time.perf_counter() - t0)
    p.join(60)
    return size / statistics.median(times) / 1e6


def section_msg(setup: Setup, rounds: int, quick: bool) -> None:
    n_rtt, n_msg = (500, 5_000) if quick else (2_000, 20_000)
    big_reps = 2 if quick else 3
    print("msg: the master and a job on another host, beside the floor (raw TCP, same namespaces) "
          "and fibercore on one machine", flush=True)
    cross: dict[str, list[float]] = {}
    clear: dict[str, list[float]] = {}  # network_encryption=False: frames authenticated, not encrypted
    floor: dict[str, list[float]] = {}
    here: dict[str, list[float]] = {}
    measures: list[tuple[str, str, str, Callable[[], float], Callable[[RawClient], float]]] = [
        ("Pipe 100 B round trip", "us", "lower", lambda: pipe_rtt_us(n_rtt), lambda raw: raw.rtt_us(n_rtt)),
        ("apply_async round trip, Pool(1)", "us", "lower", lambda: apply_rtt_us(n_rtt // 2),
         lambda raw: raw.rtt_us(n_rtt)),
        ("Queue 100 B messages/s, master to job", "msg/s", "higher", lambda: queue_rate(n_msg),
         lambda raw: raw.messages_s(n_msg)),
        ("1 MB sent over a Pipe", "MB/s", "higher", lambda: pipe_send_mb_s(1 << 20, 20),
         lambda raw: raw.send_mb_s(1 << 20, 20)),
        ("100 MB sent over a Pipe", "MB/s", "higher", lambda: pipe_send_mb_s(100 << 20, big_reps),
         lambda raw: raw.send_mb_s(100 << 20, big_reps)),
        ("100 MB array sent over a Pipe (send/recv)", "MB/s", "higher",
         lambda: pipe_send_mb_s(100 << 20, big_reps, array=True), lambda raw: raw.send_mb_s(100 << 20, big_reps)),
    ]
    for _ in range(rounds):  # interleaved: cluster, floor, one machine
        setup.on_cluster()
        raw = RawClient()
        for name, _u, _b, ours, theirs in measures:
            cross.setdefault(name, []).append(ours())
            floor.setdefault(name, []).append(theirs(raw))
        raw.close()
        setup.on_cluster(network_encryption=False)
        for name, _u, _b, ours, _t in measures:
            clear.setdefault(name, []).append(ours())
        with local():
            for name, _u, _b, ours, _t in measures:
                here.setdefault(name, []).append(ours())
    for name, unit, better, _o, _t in measures:
        c, u, f, h = (statistics.median(x[name]) for x in (cross, clear, floor, here))
        record("msg", name, unit, better, cluster=c, cluster_unencrypted=u, floor=f, one_machine=h,
               ratio_to_floor=(c / f if better == "lower" else f / c),
               unencrypted_ratio_to_floor=(u / f if better == "lower" else f / u),
               ratio_to_one_machine=(c / h if better == "lower" else h / c))


# ------------------------------------------------------------------------------ shared()
def section_shared(setup: Setup, quick: bool) -> None:
    from fibercore.testing.targets import read_shared

    hosts = len(setup.cluster.hosts)
    n = 8 * hosts
    print(f"shared: a 100 MB table read by {n} workers ({hosts} hosts x 8), and on one machine", flush=True)
    results = {}
    for where in ("cluster", "one_machine"):
        if where == "cluster":
            setup.on_cluster(setup.spread)
        else:
            fibercore.init(backend="local")
        table = fibercore.shared(np.arange(25_000_000, dtype=np.float32))
        with fibercore.Pool(n) as pool:
            pool.wait_until_workers_up(600)
            t0 = time.perf_counter()
            got = pool.starmap(read_shared, [(table, 97 * i) for i in range(4 * n)], chunksize=1)
            results[where] = (time.perf_counter() - t0, table.stats()["bytes_served"], len({m for m, _, _ in got}))
        table.release()
    (c_s, c_bytes, machines), (h_s, _, _) = results["cluster"], results["one_machine"]
    record("shared", f"100 MB shared() read by {n} workers", "s", "lower", cluster=c_s, one_machine=h_s,
           ratio_to_one_machine=c_s / h_s)
    record("shared", "master sent / (table x hosts)", "x", "lower", cluster=c_bytes / (100e6 * machines),
           hosts_reached=machines)


# ------------------------------------------------------------------------------ ES
POPULATION, DIM = bench_es_scale.POPULATION, bench_es_scale.DIM


def es_run(n: int, table: np.ndarray, generations: int, sent: Callable[[], int] | None) -> dict[str, float]:
    rng = np.random.default_rng(0)
    theta = np.zeros(DIM)
    before = sent() if sent else 0
    t0 = time.perf_counter()
    pool = fibercore.Pool(n, initializer=E.init_worker, initargs=(table, 0.001))
    try:
        pool.wait_until_workers_up(600)
        pool.map(E.hello, [0.0] * n, chunksize=1)  # every initializer ran: the table is on every host
        ready = time.perf_counter() - t0
        start_bytes = (sent() - before) if sent else 0
        times, gen_bytes = [], []
        for _ in range(generations + 1):  # the first warms up
            b0, g0 = (sent() if sent else 0), time.perf_counter()
            theta = bench_es_scale.generation(pool, theta, table, rng, chunksize=8)
            times.append(time.perf_counter() - g0)
            gen_bytes.append((sent() - b0) if sent else 0)
    finally:
        pool.terminate()
        pool.join()
    return {"ready_s": ready, "gen_s": statistics.median(times[1:]), "start_mb": start_bytes / 1e6,
            "gen_kb": statistics.median(gen_bytes[1:]) / 1e3}


def section_es(setup: Setup, quick: bool) -> None:
    generations = 2 if quick else 5
    hosts = len(setup.cluster.hosts)
    table = np.random.default_rng(123).standard_normal(25_000_000, dtype=np.float32)  # 100 MB
    print(f"es: population {POPULATION}, 1 ms an evaluation, a {table.nbytes / 1e6:.0f} MB noise table, Pool(32)",
          flush=True)
    with local():
        here = es_run(32, table, generations, None)
    setup.on_cluster(setup.one_host)
    one = es_run(32, table, generations, setup.sent)
    setup.on_cluster(setup.spread)
    spread = es_run(8 * hosts, table, generations, setup.sent)
    record("es", "seconds a generation", "s", "lower", one_machine=here["gen_s"], cluster_1x32=one["gen_s"],
           **{f"cluster_{hosts}x8": spread["gen_s"]})
    record("es", "workers ready (table on every host)", "s", "lower", one_machine=here["ready_s"],
           cluster_1x32=one["ready_s"], **{f"cluster_{hosts}x8": spread["ready_s"]})
    record("es", "master sent at the start", "MB", "lower", cluster_1x32=one["start_mb"],
           **{f"cluster_{hosts}x8": spread["start_mb"]})
    record("es", "master sent per generation", "kB", "lower", cluster_1x32=one["gen_kb"],
           **{f"cluster_{hosts}x8": spread["gen_kb"]})


# ------------------------------------------------------------------------------ PPO, SB3
def three_ways(setup: Setup, rounds: int, measure: Callable[[str], float], method: str) -> tuple[float, ...]:
    """Medians of ``measure`` with fibercore on the hosts, on this machine, and with
    multiprocessing's ``method`` here, interleaved over ``rounds``."""
    got: dict[str, list[float]] = {"cluster": [], "one_machine": [], method: []}
    for _ in range(rounds):
        setup.on_cluster(setup.spread)
        got["cluster"].append(measure("fiber"))
        with local():
            got["one_machine"].append(measure("fiber"))
        got[method].append(measure(method))
    return tuple(statistics.median(values) for values in got.values())


def section_ppo(setup: Setup, rounds: int, quick: bool) -> None:
    import bench_rl

    steps = 300 if quick else 1000
    print("ppo: 8 CartPole simulators stepped over Pipes: on the hosts, on this machine, with mp fork", flush=True)
    c, h, f = three_ways(setup, rounds, lambda m: bench_rl.ppo(
        fibercore if m == "fiber" else multiprocessing.get_context(m), 8, steps), "fork")
    record("ppo", "PPO-style loop, 8 envs, steps/s", "steps/s", "higher", cluster=c, one_machine=h, mp_fork=f,
           ratio_to_one_machine=h / c, ratio_to_fork=f / c)


def sb3_steps(n: int, steps: int, start_method: str) -> float:
    import bench_rl

    lib = fibercore if start_method == "fiber" else multiprocessing.get_context(start_method)
    return bench_rl.sb3_steps(lib, n, steps)


def section_sb3(setup: Setup, rounds: int, quick: bool) -> None:
    steps = 300 if quick else 1000
    print("sb3: SubprocVecEnv(start_method='fiber'), 8 envs on the hosts, against forkserver here", flush=True)
    c, h, f = three_ways(setup, rounds, lambda m: sb3_steps(8, steps, m), "forkserver")
    record("sb3", "SubprocVecEnv, 8 envs, env steps/s", "steps/s", "higher", cluster=c, one_machine=h,
           mp_forkserver=f, ratio_to_one_machine=h / c, ratio_to_forkserver=f / c)


# ------------------------------------------------------------------------------ report
def table_md() -> str:
    lines = []
    for section in dict.fromkeys(r[0] for r in ROWS):
        rows = [r for r in ROWS if r[0] == section]
        columns = list(dict.fromkeys(k for r in rows for k in r[4]))
        lines.append(f"\n**{section}**\n")
        lines.append("| measure | unit | " + " | ".join(c.replace("_", " ") for c in columns) + " |")
        lines.append("|---|---|" + "---|" * len(columns))
        for _s, measure, unit, better, values in rows:
            cells = [("" if c not in values else f"{values[c]:.3g}") for c in columns]
            lines.append(f"| {measure} ({better} is better) | {unit} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [(f"{measure}", values["ratio_to_floor"]) for _s, measure, _u, _b, values in ROWS
            if "ratio_to_floor" in values]
    bars += [(f"{measure} (network_encryption=False)", values["unencrypted_ratio_to_floor"])
             for _s, measure, _u, _b, values in ROWS if "unencrypted_ratio_to_floor" in values]
    bars += [(f"{measure} (vs one machine)", values["ratio_to_one_machine"]) for _s, measure, _u, _b, values in ROWS
             if "ratio_to_one_machine" in values and "ratio_to_floor" not in values]
    if not bars:
        return
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(bars) + 1.6))
    names, ratios = zip(*bars, strict=True)
    colors = ["tab:green" if r <= 1.5 else "tab:orange" if r <= 3 else "tab:red" for r in ratios]
    ax.barh(range(len(bars)), ratios, color=colors)
    ax.set_xscale("log")
    for i, r in enumerate(ratios):
        ax.text(r * 1.05, i, f"{r:.2g}x", va="center", fontsize=8)
    ax.set_yticks(range(len(bars)), names, fontsize=8)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.axvline(1.5, color="grey", linestyle="--", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("cost across hosts / its floor (raw TCP, same namespaces) or / one machine (log scale)")
    ax.set_title("fibercore between hosts of the test cluster (lower is better; 1 = the floor)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sections", nargs="*", default=["msg", "shared", "es", "ppo"])
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--sb3", action="store_true", help="also the sb3 section (the hosts' image gets torch)")
    parser.add_argument("--report", metavar="STEM", help="write STEM.md (table) and STEM.png (plot)")
    parser.add_argument("--replot", metavar="STEM", help="only draw STEM.png again from STEM.json")
    args = parser.parse_args()
    if args.replot:
        ROWS.extend(tuple(row) for row in json.loads(Path(args.replot + ".json").read_text()))
        plot(args.replot + ".png")
        return 0
    if args.report:
        args.report = os.path.abspath(args.report)  # before the chdir below
    os.chdir(BENCH)  # jobs run in the master's directory: this one, mounted on every host
    sections = list(args.sections) + (["sb3"] if args.sb3 and "sb3" not in args.sections else [])
    rounds = 1 if args.quick else args.rounds
    extra = ("gymnasium",) + (("stable-baselines3", "torch") if "sb3" in sections else ())
    setup = Setup(args.hosts, extra)
    try:
        print(f"bench_cluster: {setup.hosts} hosts, {os.cpu_count()} CPUs shared by all, "
              f"rounds {rounds}", flush=True)
        for section in sections:
            if section == "msg":
                section_msg(setup, rounds, args.quick)
            elif section == "shared":
                section_shared(setup, args.quick)
            elif section == "es":
                section_es(setup, args.quick)
            elif section == "ppo":
                section_ppo(setup, rounds, args.quick)
            elif section == "sb3":
                section_sb3(setup, rounds, args.quick)
            else:
                print(f"bench_cluster: no section {section!r}", file=sys.stderr)
                return 2
    finally:
        setup.close()
    text = table_md()
    print(text)
    if args.report:
        Path(args.report + ".md").write_text(
            f"bench_cluster, {time.strftime('%Y-%m-%d')}, {setup.hosts} hosts (containers on one "
            f"bridge) sharing {os.cpu_count()} CPUs, rounds {rounds}{' (--quick)' if args.quick else ''}\n{text}\n")
        Path(args.report + ".json").write_text(json.dumps(ROWS, indent=1))
        plot(args.report + ".png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
