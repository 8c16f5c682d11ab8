"""The reinforcement-learning hot paths: fibercore vs multiprocessing (fork, spawn, forkserver)
side by side in one run, interleaved, medians of rounds, printed as ratios.

    python bench/bench_rl.py                       # every section, 3 rounds (about 10 minutes)
    python bench/bench_rl.py --quick               # fewer steps and pool sizes (about 3 minutes)
    python bench/bench_rl.py --rounds 5 ppo pipe   # chosen sections only
    python bench/bench_rl.py --report docs/perf/bench_rl   # also writes bench_rl.md
    python bench/bench_rl.py --paired ppo vecenv pipe queue sb3   # paired blocks (below)

Sections (each in both regimes where it has processes: as many as the cores, and 4× more,
which is the usual RL set-up of more simulators than cores):
  ppo      N CartPole simulators, each in its own Process stepped over a Pipe by the master
           (send every action, then receive every observation): steps/s of all N
  vecenv   gymnasium's AsyncVectorEnv(context=...) with N CartPole envs, 2,000 steps (--quick:
           500), with and without shared_memory: seconds
  pipe     a 100-byte round trip over a Pipe to one child (send_bytes, echo, recv_bytes)
  queue    a 100-byte round trip through two Queues (the master puts, the child echoes)
  qrate    100-byte Queue messages/s: the master putting to one child, and N children putting
           to the master (1 and 4x cores)
  prate    100-byte Pipe messages/s: N children each sending on its own Pipe, the master
           receiving from all (1 and 4x cores)
  apply    one apply_async round trip on Pool(N)
  smallnp  Pool(N).map of 64 (numpy array of 8 floats, int) tuples: time per map
  chunk1   Pool(64) and Pool(128) (--quick: 64 only), busy 1 ms tasks with chunksize=1: tasks/s
  strag    smallnp's maps while one worker runs a task of 1 s of CPU (a long episode among
           short ones): time per map
  mixed    Pool(N).map of 1,000 busy tasks, the first 300 ms, the others 0.2 ms: seconds
  noop     Pool(64) and Pool(128), a map of 200,000 no-op items: items/s
  idle     an idle Pool(4) for 10 s (--quick: 5 s): CPU milliseconds of the master and its workers
  start    8 Process objects started to their first message
  uss      a Pool worker's unique memory (USS) after its first task
  es       bench_workloads.py's ES on CartPole (5 generations of 48 candidates) on Pool(N)
  cma      bench_workloads.py's pycma on a costly 40-D Rastrigin (10 iterations of 24) on Pool(N)
  ng       Nevergrad's OnePlusOne.minimize over a 5 ms objective, budget 400 (--quick: 100),
           through fibercore.Executor vs ProcessPoolExecutor(mp_context=...): seconds
  sb3      stable-baselines3's SubprocVecEnv(start_method=...) with N CartPole envs, random
           actions, 1,000 steps (--quick: 300): env steps/s (not counting the envs' start)
  sb3start a fresh program's SubprocVecEnv(start_method=...) with N envs: seconds to its
           first reset (a new interpreter each time, SB3 imported first, as a user's script)
  sb3ppo   stable-baselines3's PPO on SubprocVecEnv with 8 CartPole envs: seconds of
           learn(16,384 steps) (--quick: 4,096), start not counted

With ``--paired``, ppo, vecenv, pipe, queue and sb3 keep every library's processes up at
once and measure them in turns of short blocks (``--blocks`` a round); the ratio is the median
of the ratios of neighbouring blocks, printed with its quartiles. On a shared VM whose speed
moves over seconds, the plain ratio of medians taken minutes apart moves with it.

Ratios are fibercore / multiprocessing with each start method; "higher" or "lower" says
which is better. Every library runs the same functions (bench/_rl_tasks.py, pickled by
reference) on the same machine in the same run; rounds rotate which library goes first.
BLAS is pinned to one thread for every library (as ES and RL code does), see
bench_workloads.py. A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _rl_tasks as T  # noqa: E402

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
METHODS = ("fork", "spawn", "forkserver")
#: (section, setting, unit, better, {library: [values]})
RESULTS: list[tuple[str, str, str, str, dict[str, list[float]]]] = []
ROUNDS = [3]


def libraries(methods: tuple[str, ...]) -> list[tuple[str, Any]]:
    import fibercore

    return [("fibercore", fibercore)] + [(m, multiprocessing.get_context(m)) for m in methods]


# ------------------------------------------------------------------------------------ measures
class Stepping:
    """``n`` CartPole simulators, each in its own Process stepped over a Pipe by the master
    (send every action, then receive every observation), up and warm; :meth:`block` times
    ``steps`` steps of all of them: steps/s."""

    def __init__(self, lib: Any, n: int) -> None:
        self.pipes, self.procs = [], []
        for _ in range(n):
            a, b = lib.Pipe()
            p = lib.Process(target=T.env_worker, args=(b, "CartPole-v1"), daemon=True)
            p.start()
            b.close()  # as SubprocVecEnv does: the child holds its end
            self.pipes.append(a)
            self.procs.append(p)
        for c in self.pipes:
            c.send(0)
        for c in self.pipes:
            c.recv()

    def block(self, steps: int) -> float:
        pipes = self.pipes
        t0 = time.perf_counter()
        for i in range(steps):
            for c in pipes:
                c.send(i & 1)
            for c in pipes:
                c.recv()
        return len(pipes) * steps / (time.perf_counter() - t0)

    def close(self) -> None:
        for c in self.pipes:
            c.send(None)
        for p in self.procs:
            p.join(30)


def ppo(lib: Any, n: int, steps: int) -> float:
    return _one_block(Stepping(lib, n), steps)


class VectorStepping:
    """A vector of ``n`` CartPole envs (gymnasium's AsyncVectorEnv on this library's context,
    or, with ``sb3``, stable-baselines3's SubprocVecEnv), reset and warm; :meth:`block` times
    ``steps`` steps (actions 0 and 1 in turn, or SB3's random ones): seconds, or with
    ``sb3`` env steps/s."""

    def __init__(self, lib: Any, n: int, shared_memory: bool = False, sb3: bool = False) -> None:
        import numpy as np

        self.n, self.sb3 = n, sb3
        if sb3:
            self.envs = _sb3_vec(lib, n)
            self.envs.reset()
            self.rng = np.random.default_rng(0)
        else:
            import functools

            import gymnasium as gym

            context = "fiber" if getattr(lib, "__name__", "") == "fibercore" else lib.get_start_method()
            self.envs = gym.vector.AsyncVectorEnv([functools.partial(gym.make, "CartPole-v1")] * n,
                                                  shared_memory=shared_memory, context=context)
            self.envs.reset(seed=0)
        self.actions = np.zeros(n, dtype=np.int64)
        for _ in range(20):
            self.envs.step(self.actions)

    def block(self, steps: int) -> float:
        envs, actions = self.envs, self.actions
        if self.sb3:
            chosen = self.rng.integers(0, 2, size=(steps, self.n))
            t0 = time.perf_counter()
            for a in chosen:
                envs.step(a)
            return self.n * steps / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        for i in range(steps):
            actions[:] = i & 1
            envs.step(actions)
        return time.perf_counter() - t0

    def close(self) -> None:
        self.envs.close()


def vector_env(lib: Any, n: int, steps: int, shared_memory: bool) -> float:
    """gymnasium's AsyncVectorEnv on this library's context: seconds for ``steps`` steps."""
    return _one_block(VectorStepping(lib, n, shared_memory), steps)


def _sb3_vec(lib: Any, n: int) -> Any:
    from stable_baselines3.common.vec_env import SubprocVecEnv

    method = "fiber" if getattr(lib, "__name__", "") == "fibercore" else lib.get_start_method()
    return SubprocVecEnv([T.make_cartpole] * n, start_method=method)


def sb3_steps(lib: Any, n: int, steps: int) -> float:
    """Env steps/s of stable-baselines3's SubprocVecEnv with ``n`` envs, random actions."""
    return _one_block(VectorStepping(lib, n, sb3=True), steps)


def sb3_start(lib: Any, n: int) -> float:
    """Seconds a fresh program takes from SubprocVecEnv(``n`` envs) to its first reset()
    (bench/_sb3_start.py, each in a new interpreter: what a user's program pays)."""
    import subprocess

    method = "fiber" if getattr(lib, "__name__", "") == "fibercore" else lib.get_start_method()
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run([sys.executable, os.path.join(here, "_sb3_start.py"), method, str(n)], cwd=here,
                          capture_output=True, text=True, timeout=600, check=True)
    return float(done.stdout.split()[-1])


def sb3_ppo(lib: Any, steps: int) -> float:
    """Seconds of stable-baselines3 PPO's learn(``steps``) on 8 SubprocVecEnv CartPole envs."""
    from stable_baselines3 import PPO

    vec = _sb3_vec(lib, 8)
    try:
        model = PPO("MlpPolicy", vec, n_steps=max(64, steps // 8), batch_size=256, seed=0, device="cpu")
        t0 = time.perf_counter()
        model.learn(total_timesteps=steps)
        return time.perf_counter() - t0
    finally:
        vec.close()


WARM = 200  # round trips before timing: connected, warm


class RoundTrips:
    """A 100-byte echo through a Pipe (``queue``: through two Queues) to one child, up and
    warm; :meth:`block` times ``n`` round trips: µs each."""

    def __init__(self, lib: Any, queue: bool = False) -> None:
        if queue:
            self.inq, outq = lib.Queue(), lib.Queue()
            self.proc = lib.Process(target=T.echo_queue, args=(self.inq, outq))
            self.send, self.recv = self.inq.put, outq.get
        else:
            a, b = lib.Pipe()
            self.proc = lib.Process(target=T.echo_bytes_until_empty, args=(b,))
            self.send, self.recv = a.send_bytes, a.recv_bytes
        self.proc.start()
        self.queue = queue
        self.block(WARM)

    def block(self, n: int) -> float:
        send, recv, payload = self.send, self.recv, b"x" * 100
        t0 = time.perf_counter()
        for _ in range(n):
            send(payload)
            recv()
        return (time.perf_counter() - t0) / n * 1e6

    def close(self) -> None:
        self.send(None if self.queue else b"")
        if self.queue:
            self.recv()
        self.proc.join(30)


def pipe_rtt(lib: Any, n: int) -> float:
    """µs per 100-byte round trip over a Pipe to an echoing child (after WARM ones)."""
    return _one_block(RoundTrips(lib), n)


def queue_rtt(lib: Any, n: int) -> float:
    """µs per 100-byte round trip through two Queues to an echoing child (after WARM ones)."""
    return _one_block(RoundTrips(lib, queue=True), n)


def _one_block(measure: Any, work: int) -> float:
    """One block of a measure object (Stepping, VectorStepping, RoundTrips), then its end."""
    try:
        return float(measure.block(work))
    finally:
        measure.close()


def queue_rate_out(lib: Any, n: int) -> float:
    """Items/s the master puts to one child that gets them (to the last one's arrival)."""
    q, done = lib.Queue(), lib.Queue()
    p = lib.Process(target=T.get_n, args=(q, done, n + 1))
    p.start()
    q.put(b"w")  # connected and warm
    time.sleep(0.3)
    payload = b"x" * 100
    t0 = time.perf_counter()
    for _ in range(n):
        q.put(payload)
    end = done.get()
    p.join(30)
    return n / (end - t0)


def queue_rate_in(lib: Any, writers: int, n: int) -> float:
    """Items/s the master gets from ``writers`` children putting to one Queue at once."""
    q, ready, go = lib.Queue(), lib.Queue(), lib.Event()
    each = n // writers
    procs = [lib.Process(target=T.put_when_told, args=(q, ready, go, each, 100)) for _ in range(writers)]
    for p in procs:
        p.start()
    for _ in procs:
        ready.get()
    t0 = time.perf_counter()
    go.set()
    for _ in range(each * writers):
        q.get()
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join(30)
    return each * writers / elapsed


def pipe_rate_in(lib: Any, children: int, n: int) -> float:
    """Messages/s the master receives from ``children`` children, each sending on its own Pipe."""
    go = lib.Event()
    each = n // children
    ends, procs = [], []
    for _ in range(children):
        a, b = lib.Pipe()
        procs.append(lib.Process(target=T.send_when_told, args=(b, go, each, 100)))
        procs[-1].start()
        b.close()
        ends.append(a)
    time.sleep(0.3)
    t0 = time.perf_counter()
    go.set()
    for _ in range(each):
        for a in ends:
            a.recv_bytes()
    elapsed = time.perf_counter() - t0
    for a in ends:
        a.send_bytes(b"done")
    for p in procs:
        p.join(30)
    return each * children / elapsed


def _workloads() -> Any:
    import bench_workloads

    return bench_workloads


def es_seconds(lib: Any, workers: int) -> float:
    """bench_workloads' ES: 5 generations on Pool(workers), after one to warm up."""
    import numpy as np

    W = _workloads()
    with lib.Pool(workers) as pool:
        theta = W.es_generation(pool, np.zeros(W.OBS * W.ACT), 0)
        t0 = time.perf_counter()
        for gen in range(1, 6):
            theta = W.es_generation(pool, theta, gen)
        return time.perf_counter() - t0


def cma_seconds(lib: Any, workers: int) -> float:
    """bench_workloads' pycma: 10 iterations on Pool(workers), after one to warm up."""
    W = _workloads()
    with lib.Pool(workers) as pool:
        W.cma_run(pool, 1)
        t0 = time.perf_counter()
        W.cma_run(pool, 10)
        return time.perf_counter() - t0


def nevergrad_seconds(lib: Any, workers: int, budget: int) -> float:
    """Seconds of Nevergrad's OnePlusOne.minimize over a 5 ms objective with ``workers``
    workers: through fibercore.Executor, or concurrent.futures' ProcessPoolExecutor with the
    start method (Nevergrad's documented way), started before the clock."""
    import concurrent.futures

    import nevergrad as ng

    if getattr(lib, "__name__", "") == "fibercore":
        executor: Any = lib.Executor(max_workers=workers)
    else:
        executor = concurrent.futures.ProcessPoolExecutor(max_workers=workers, mp_context=lib)
    with executor:
        list(executor.map(T.sphere_costly, [[0.0]] * workers))  # the workers up
        opt = ng.optimizers.OnePlusOne(parametrization=4, budget=budget, num_workers=workers)
        t0 = time.perf_counter()
        opt.minimize(T.sphere_costly, executor=executor)
        return time.perf_counter() - t0


def apply_rtt(lib: Any, workers: int, n: int) -> float:
    with lib.Pool(workers) as pool:
        pool.map(T.noop, range(workers * 4), 1)
        for _ in range(50):
            pool.apply_async(T.nothing).get()
        t0 = time.perf_counter()
        for _ in range(n):
            pool.apply_async(T.nothing).get()
        return (time.perf_counter() - t0) / n * 1e6


def small_numpy(lib: Any, workers: int, maps: int) -> float:
    import numpy as np

    items = [(np.arange(8, dtype=np.float64), k) for k in range(64)]
    with lib.Pool(workers) as pool:
        for _ in range(5):
            pool.map(T.small_numpy, items)
        t0 = time.perf_counter()
        for _ in range(maps):
            pool.map(T.small_numpy, items)
        return (time.perf_counter() - t0) / maps * 1e3


def straggler(lib: Any, workers: int, maps: int) -> float:
    """smallnp's maps while one worker is busy with a long task (submitted first)."""
    import numpy as np

    items = [(np.arange(8, dtype=np.float64), k) for k in range(64)]
    with lib.Pool(workers) as pool:
        for _ in range(5):
            pool.map(T.small_numpy, items)
        long = pool.apply_async(T.busy, (1000.0,))
        t0 = time.perf_counter()
        for _ in range(maps):
            pool.map(T.small_numpy, items)
        took = (time.perf_counter() - t0) / maps * 1e3
        long.get()
        return took


def mixed_map(lib: Any, workers: int) -> float:
    """One map whose first task is long and the rest short: seconds to its end."""
    with lib.Pool(workers) as pool:
        pool.map(T.noop, range(workers * 2), 1)
        t0 = time.perf_counter()
        pool.map(T.busy, [300.0] + [0.2] * 999)
        return time.perf_counter() - t0


def chunk1(lib: Any, workers: int, tasks: int) -> float:
    with lib.Pool(workers) as pool:
        pool.map(T.noop, range(workers * 2), 1)  # every worker up
        t0 = time.perf_counter()
        pool.map(T.busy, [1.0] * tasks, chunksize=1)
        return tasks / (time.perf_counter() - t0)


def noop_map(lib: Any, workers: int, items: int) -> float:
    with lib.Pool(workers) as pool:
        pool.map(T.noop, range(workers * 2), 1)
        t0 = time.perf_counter()
        pool.map(T.noop, range(items))
        return items / (time.perf_counter() - t0)


def _cpu_seconds(pid: int, skip: int = 0) -> float:
    """CPU time of every thread of ``pid`` but ``skip`` (from schedstat: nanoseconds, not clock ticks)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        if int(tid) == skip:
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as fh:
                total += int(fh.read().split()[0])
        except OSError:  # the thread ended meanwhile
            pass
    return total / 1e9


def _worker_pids(pool: Any) -> list[int]:
    procs = pool.workers() if hasattr(pool, "workers") else pool._pool
    return [p.pid for p in procs if p.pid]


def idle_cpu(lib: Any, seconds: float) -> float:
    """CPU of an idle Pool(4)'s master and workers over ``seconds``, measured from a thread
    whose own time is left out: reading every thread's schedstat costs more than an idle
    pool, and a library with more threads would be charged more for the reading."""
    import threading

    result: list[float] = []

    def measure(pids: list[int]) -> None:
        me = threading.get_native_id()
        before = sum(_cpu_seconds(p, me) for p in pids)
        time.sleep(seconds)
        result.append((sum(_cpu_seconds(p, me) for p in pids) - before) * 1e3)

    with lib.Pool(4) as pool:
        pool.map(T.noop, range(16), 1)
        time.sleep(0.5)
        measuring = threading.Thread(target=measure, args=([os.getpid(), *_worker_pids(pool)],))
        measuring.start()
        measuring.join()
        return result[0]


def start8(lib: Any) -> float:
    q = lib.Queue()
    t0 = time.perf_counter()
    procs = [lib.Process(target=T.first_message, args=(q, t0)) for _ in range(8)]
    for p in procs:
        p.start()
    for _ in procs:
        q.get()
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join(30)
    return elapsed


def worker_uss(lib: Any) -> float:
    with lib.Pool(2) as pool:
        pool.map(T.small_numpy, [(__import__("numpy").ones(8), 1)] * 8, 1)
        sizes = []
        for pid in _worker_pids(pool):
            with open(f"/proc/{pid}/smaps_rollup") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
            sizes.append(sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty")) / 1024)
        return statistics.mean(sizes)


# ------------------------------------------------------------------------------------ running
def measure(section: str, setting: str, unit: str, better: str, libs: list[tuple[str, Any]],
            rounds: int, fn: Callable[[Any], float]) -> None:
    values: dict[str, list[float]] = {name: [] for name, _ in libs}
    for r in range(rounds):
        order = libs[r % len(libs):] + libs[:r % len(libs)]  # each library goes first in turn
        for name, lib in order:
            values[name].append(fn(lib))
    RESULTS.append((section, setting, unit, better, values))
    ours = statistics.median(values["fibercore"])
    cells = []
    for name, _ in libs[1:]:
        theirs = statistics.median(values[name])
        cells.append(f"{name} {theirs:10.4g} ({_ratio(ours, theirs)})")
    print(f"{section:8} {setting:16} fibercore {ours:10.4g} {unit:7} | " + " | ".join(cells)
          + f"   [{better} is better]", flush=True)


#: (section, setting) -> {start method: (median, lower quartile, upper quartile)} of the
#: ratios of paired blocks (:func:`paired`).
PAIRED: dict[tuple[str, str], dict[str, tuple[float, float, float]]] = {}


def paired(section: str, setting: str, unit: str, better: str, libs: list[tuple[str, Any]], rounds: int,
           blocks: int, make: Callable[[Any], Any], work: int) -> None:
    """``section`` measured in paired blocks: every library's processes up and warm at once
    (``make(lib)``: an object with ``block(work)`` and ``close()``), then ``blocks`` short blocks
    each, the libraries taking turns (each first in turn), so that a library and the one
    measured just before or after it see the same machine; the ratio of each block to its
    neighbour's is kept. A shared VM's speed moves 10-40% over seconds: a ratio of
    medians taken minutes apart moves with it, a median of paired ratios much less. Repeated
    for ``rounds`` fresh sets of processes (their placement on the CPUs varies too)."""
    values: dict[str, list[float]] = {name: [] for name, _ in libs}
    ratios: dict[str, list[float]] = {name: [] for name, _ in libs[1:]}
    for r in range(rounds):
        made: list[tuple[str, Any]] = []
        try:
            for name, lib in libs:
                made.append((name, make(lib)))
            for b in range(blocks):
                k = (r * blocks + b) % len(made)
                got = {name: obj.block(work) for name, obj in made[k:] + made[:k]}
                for name, value in got.items():
                    values[name].append(value)
                for name in ratios:
                    ratios[name].append(got["fibercore"] / got[name])
        finally:
            for _name, obj in made:
                obj.close()
    RESULTS.append((section, setting, unit, better, values))
    spread = {}
    for name, rs in ratios.items():
        q1, median, q3 = statistics.quantiles(rs, n=4) if len(rs) > 1 else (rs[0],) * 3
        spread[name] = (median, q1, q3)
    PAIRED[(section, setting)] = spread
    ours = statistics.median(values["fibercore"])
    cells = [f"{name} {statistics.median(values[name]):10.4g} ({m:4.2f}x, {q1:4.2f}-{q3:4.2f})"
             for name, (m, q1, q3) in spread.items()]
    print(f"{section:8} {setting:16} fibercore {ours:10.4g} {unit:7} | " + " | ".join(cells)
          + f"   [{better} is better; paired ratio, quartiles]", flush=True)


def _ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:5.2f}x" if theirs else "  n/a"


def report(path: str, methods: tuple[str, ...]) -> None:
    import platform

    lines = [
        f"`python bench/bench_rl.py --rounds {ROUNDS[0]}` on {CORES} CPUs, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d %H:%M')}; medians of the rounds; ratio = fibercore / multiprocessing "
        "with that start method.",
        "",
        "| section | setting | unit | fibercore | " + " | ".join(methods) + " | "
        + " | ".join(f"ratio to {m}" for m in methods) + " | better |",
        "|" + "---|" * (5 + 2 * len(methods)),
    ]
    for section, setting, unit, better, values in RESULTS:
        ours = statistics.median(values["fibercore"])
        theirs = [statistics.median(values[m]) for m in methods]
        pairs = PAIRED.get((section, setting))
        ratios = ([f"{pairs[m][0]:.2f}x" for m in methods] if pairs
                  else [_ratio(ours, v).strip() for v in theirs])
        lines.append(f"| {section} | {setting} | {unit} | {ours:.4g} | " + " | ".join(f"{v:.4g}" for v in theirs)
                     + " | " + " | ".join(ratios) + f" | {better} |")
    if PAIRED:
        lines += ["", "Rows measured in paired blocks (`--paired`): the ratio is the median of the ratios of "
                  "neighbouring blocks; their quartiles:", ""]
        for (section, setting), pairs in PAIRED.items():
            lines.append(f"- {section} {setting}: " + ", ".join(
                f"{m} {q1:.2f}-{q3:.2f}" for m, (_med, q1, q3) in pairs.items()))
    with open(path + ".md", "w") as fh:
        fh.write("\n".join(lines) + "\n")
    print(f"wrote {path}.md")
    plot(path)


def plot(path: str) -> None:
    """PATH.png from the table in PATH.md: per row, fibercore's speed relative to each start
    method (above 1: fibercore is faster; a time's inverse ratio, a rate's ratio)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(path + ".md") as fh:
        rows = [line.strip().strip("|").split("|") for line in fh if line.startswith("| ") and "---" not in line]
    header, rows = [c.strip() for c in rows[0]], [[c.strip() for c in r] for r in rows[1:]]
    methods = [c.removeprefix("ratio to ") for c in header if c.startswith("ratio to ")]
    first = header.index(f"ratio to {methods[0]}")
    names = [f"{r[0]} {r[1]}" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.4))
    height = 0.8 / len(methods)
    for k, method in enumerate(methods):
        speed = []
        for r in rows:
            cell = r[first + k].rstrip("x")
            ratio = float(cell) if cell not in ("n/a", "") and float(cell) > 0 else float("nan")
            speed.append(ratio if r[-1] == "higher" else 1.0 / ratio)  # nan: no bar
        ys = [len(rows) - 1 - i + (k - (len(methods) - 1) / 2) * height for i in range(len(rows))]
        ax.barh(ys, speed, height=height, label=f"vs {method}")
    ax.set_yticks(range(len(rows)), names[::-1])
    ax.set_xscale("log")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("fibercore's speed relative to multiprocessing (>1: faster; log scale)")
    ax.set_title(f"bench_rl, one run ({CORES} CPUs)", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path + ".png", dpi=100)
    print(f"wrote {path}.png")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*",
                        help="ppo vecenv pipe queue qrate prate apply smallnp strag mixed chunk1 noop idle start uss "
                             "es cma ng sb3 sb3start sb3ppo")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--methods", default=",".join(METHODS), help="multiprocessing start methods to compare")
    parser.add_argument("--report", help="write a markdown table to REPORT.md and its plot to REPORT.png")
    parser.add_argument("--paired", action="store_true",
                        help="ppo, vecenv, pipe, queue and sb3 in paired blocks (every library up at once, taking "
                             "turns in short blocks; median of the neighbours' ratios)")
    parser.add_argument("--blocks", type=int, default=10, help="blocks per library and round with --paired")
    args = parser.parse_args()
    methods = tuple(m for m in args.methods.split(",") if m)
    ROUNDS[0] = args.rounds
    libs = libraries(methods)
    want = set(args.sections) or {"ppo", "vecenv", "pipe", "queue", "qrate", "prate", "apply", "smallnp", "strag",
                                  "mixed", "chunk1", "noop", "idle", "start", "uss", "es", "cma", "ng", "sb3",
                                  "sb3start", "sb3ppo"}
    quick = args.quick
    few, many = CORES, 4 * CORES
    print(f"{CORES} cores; rounds {args.rounds}; regimes: {few} and {many} processes", flush=True)
    m = args.rounds

    def in_both_regimes(section: str, unit: str, better: str, fn: Callable[[int], Callable[[Any], float]],
                        setting: str = "Pool({n})") -> None:
        """``section`` measured with as many processes as cores, then four times as many."""
        for n in (few, many):
            measure(section, setting.format(n=n), unit, better, libs, m, fn(n))

    blocks = args.blocks

    def stepping(section: str, setting: str, unit: str, better: str, make: Callable[[Any], Any], work: int,
                 whole: Callable[[Any], float]) -> None:
        """A stepping section: in paired blocks of ``work`` (``--paired``: ``blocks`` of them a
        round), or as one measure of ``whole`` a library and round."""
        if args.paired:
            paired(section, setting, unit, better, libs, m, blocks, make, work)
        else:
            measure(section, setting, unit, better, libs, m, whole)

    if "ppo" in want:
        for n, steps in ((few, 1000 if quick else 3000), (many, 300 if quick else 800)):
            stepping("ppo", f"{n} envs", "steps/s", "higher", partial(Stepping, n=n), max(10, steps // blocks),
                     partial(ppo, n=n, steps=steps))
    if "vecenv" in want:
        for n in (few, many):
            for shm in (False, True):
                steps = 500 if quick else 2000
                stepping("vecenv", f"{n} envs{' shm' if shm else ''}", "s", "lower",
                         partial(VectorStepping, n=n, shared_memory=shm), max(10, steps // blocks),
                         partial(vector_env, n=n, steps=steps, shared_memory=shm))
    if "pipe" in want:
        n_rt = 2000 if quick else 5000
        stepping("pipe", "100 B round trip", "us", "lower", RoundTrips, max(50, n_rt // blocks),
                 partial(pipe_rtt, n=n_rt))
    if "queue" in want:
        n_rt = 1000 if quick else 3000
        stepping("queue", "100 B round trip", "us", "lower", partial(RoundTrips, queue=True), max(50, n_rt // blocks),
                 partial(queue_rtt, n=n_rt))
    if "qrate" in want:
        measure("qrate", "master to 1", "msg/s", "higher", libs, m,
                partial(queue_rate_out, n=10_000 if quick else 50_000))
        for n in (1, many):
            measure("qrate", f"{n} to master", "msg/s", "higher", libs, m,
                    partial(queue_rate_in, writers=n, n=10_000 if quick else 50_000))
    if "prate" in want:
        for n in (1, many):
            measure("prate", f"{n} to master", "msg/s", "higher", libs, m,
                    partial(pipe_rate_in, children=n, n=10_000 if quick else 50_000))
    if "apply" in want:
        in_both_regimes("apply", "us", "lower", lambda n: partial(apply_rtt, workers=n, n=500 if quick else 2000))
    if "smallnp" in want:
        in_both_regimes("smallnp", "ms/map", "lower",
                        lambda n: partial(small_numpy, workers=n, maps=20 if quick else 50))
    if "strag" in want:
        in_both_regimes("strag", "ms/map", "lower", lambda n: partial(straggler, workers=n, maps=10 if quick else 20))
    if "mixed" in want:
        in_both_regimes("mixed", "s", "lower", lambda n: partial(mixed_map, workers=n))
    if "chunk1" in want:
        for n in (64,) if quick else (64, 128):
            measure("chunk1", f"Pool({n})", "tasks/s", "higher", libs, m,
                    partial(chunk1, workers=n, tasks=1000 if quick else 4000))
    if "noop" in want:
        for n in (64,) if quick else (64, 128):
            measure("noop", f"Pool({n})", "items/s", "higher", libs, m, partial(noop_map, workers=n, items=200_000))
    if "idle" in want:
        idle_s = 5.0 if quick else 10.0
        measure("idle", f"Pool(4), {idle_s:.0f} s", "cpu ms", "lower", libs, m, partial(idle_cpu, seconds=idle_s))
    if "start" in want:
        measure("start", "8 Processes", "s", "lower", libs, m, start8)
    if "uss" in want:
        measure("uss", "Pool(2) worker", "MiB", "lower", libs, m, worker_uss)
    if "es" in want:
        in_both_regimes("es", "s", "lower", lambda n: partial(es_seconds, workers=n))
    if "cma" in want:
        in_both_regimes("cma", "s", "lower", lambda n: partial(cma_seconds, workers=n))
    if "sb3" in want:
        for n in (few, many):
            steps = 300 if quick else 1000
            stepping("sb3", f"{n} envs", "steps/s", "higher", partial(VectorStepping, n=n, sb3=True),
                     max(10, steps // blocks), partial(sb3_steps, n=n, steps=steps))
    if "ng" in want:
        in_both_regimes("ng", "s", "lower",
                        lambda n: partial(nevergrad_seconds, workers=n, budget=100 if quick else 400), "{n} workers")
    if "sb3start" in want:
        in_both_regimes("sb3start", "s", "lower", lambda n: partial(sb3_start, n=n), "{n} envs")
    if "sb3ppo" in want:
        steps = 4096 if quick else 16_384
        measure("sb3ppo", f"8 envs, {steps} steps", "s", "lower", libs, m, partial(sb3_ppo, steps=steps))
    if args.report:
        report(args.report, methods)
    return 0


if __name__ == "__main__":
    sys.exit(main())
