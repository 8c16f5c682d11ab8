"""The two transports side by side: fibercore's built-in (TCP/Unix) and fiber-nng (pynng), with
multiprocessing (fork, spawn) in the same run, as ratios.

    python bench/bench_transports.py                 # 3 rounds (about 4 minutes)
    python bench/bench_transports.py --rounds 5 --report docs/perf/transports

Measures (each in a fresh interpreter per library and round, rounds interleaved, medians):
  pipe_rtt      a 100-byte round trip over a Pipe to one child (send_bytes, echo, recv_bytes): µs
  apply_rtt     one apply_async round trip on Pool(2): µs
  queue_100b    Queue messages/s of 100 bytes, one process putting, one getting
  queue_1mb     Queue messages/s of 1 MB
  overhead_1ms  the paper's overhead test: Pool(5), 5,000 tasks sleeping 1 ms (ideal 1 s): s
and the same with four times more processes than cores (the usual RL set-up):
  pipes_over    4 x cores children, each echoing 100 B over its Pipe; the master sends to every
                one, then receives from every one: messages/s
  apply_over    one apply_async round trip on Pool(4 x cores): µs
  overhead_over Pool(4 x cores), 1 ms tasks, 1,000 per worker (ideal 1 s): s

Both processes of every measure run on this machine, so the built-in transport uses a Unix
socket where it can, and fiber-nng TCP on 127.0.0.1 (nng's ipc would need the same care with
names and owners that the built-in's Unix sockets get). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

MEASURES = {
    "pipe_rtt": ("Pipe 100 B round trip", "us", "lower"),
    "apply_rtt": ("apply_async round trip, Pool(2)", "us", "lower"),
    "queue_100b": ("Queue 100 B messages/s", "msg/s", "higher"),
    "queue_1mb": ("Queue 1 MB messages/s", "msg/s", "higher"),
    "overhead_1ms": ("overhead test, 1 ms tasks (ideal 1 s)", "s", "lower"),
    "pipes_over": (f"Pipes to {4 * CORES} children, 100 B messages/s", "msg/s", "higher"),
    "apply_over": (f"apply_async round trip, Pool({4 * CORES})", "us", "lower"),
    "overhead_over": (f"overhead test, Pool({4 * CORES}), 1 ms tasks (ideal 1 s)", "s", "lower"),
}
LIBRARIES = ("fibercore tcp", "fibercore nng", "mp fork", "mp spawn")


def _library(name: str):  # type: ignore[no-untyped-def]
    if name.startswith("fibercore"):
        import fibercore

        return fibercore
    import multiprocessing

    return multiprocessing.get_context(name.split()[1])


def measure(name: str, library: str) -> float:
    """One measure in this interpreter (a child of the main run)."""
    import bench_ipc
    import bench_pool

    lib = _library(library)
    if name == "pipe_rtt":
        return 1e6 * bench_ipc.pipe_rtt(lib, 100, 2000)
    if name == "apply_rtt":
        return bench_pool.rtt(lib, 2000)
    if name == "queue_100b":
        return bench_ipc.queue_rate(lib, 100, 20_000)
    if name == "queue_1mb":
        return bench_ipc.queue_rate(lib, 1 << 20, 200)
    if name == "overhead_1ms":
        return bench_pool.overhead(lib, 0.001)
    if name == "pipes_over":
        return pipes_rate(lib, 4 * CORES, 500)
    if name == "apply_over":
        return bench_pool.rtt(lib, 2000, processes=4 * CORES)
    if name == "overhead_over":
        return overhead(lib, 4 * CORES, 0.001)
    raise SystemExit(f"unknown measure {name}")


def pipes_rate(lib, children: int, rounds: int) -> float:  # type: ignore[no-untyped-def]
    """Messages/s when the master steps ``children`` echoing children over their Pipes."""
    import bench_ipc

    ends = [lib.Pipe() for _ in range(children)]
    procs = [lib.Process(target=bench_ipc.echo, args=(child, rounds + 10)) for _, child in ends]
    for p in procs:
        p.start()
    payload = b"x" * 100
    for _ in range(10):  # every child up and connected
        for parent, _ in ends:
            parent.send_bytes(payload)
        for parent, _ in ends:
            parent.recv_bytes()
    t0 = time.perf_counter()
    for _ in range(rounds):
        for parent, _ in ends:
            parent.send_bytes(payload)
        for parent, _ in ends:
            parent.recv_bytes()
    elapsed = time.perf_counter() - t0
    for p in procs:
        p.join()
    return rounds * children / elapsed


def overhead(lib, processes: int, d: float) -> float:  # type: ignore[no-untyped-def]
    """The overhead test with ``processes`` workers, 1/d tasks each (ideal 1 s)."""
    import _tasks

    with lib.Pool(processes) as pool:
        pool.map(_tasks.sleep_for, [0.3] * processes, 1)
        t0 = time.perf_counter()
        pool.map(_tasks.sleep_for, [d] * int(round(processes / d)))
        return time.perf_counter() - t0


def run_child(name: str, library: str) -> float:
    env = dict(os.environ)
    if library.startswith("fibercore"):
        env["FIBER_TRANSPORT"] = library.split()[1]
    out = subprocess.run([sys.executable, __file__, "--child", name, library], capture_output=True, text=True,
                         env=env, timeout=600, cwd=HERE)
    if out.returncode != 0:
        raise SystemExit(f"{library} {name} failed:\n{out.stderr[-3000:]}")
    return float(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("measures", nargs="*", default=list(MEASURES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--report", help="write REPORT.md")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(*args.child)))
        return 0
    results: dict[tuple[str, str], list[float]] = {}
    for round_ in range(args.rounds):
        for name in args.measures:
            order = LIBRARIES[round_ % len(LIBRARIES):] + LIBRARIES[:round_ % len(LIBRARIES)]
            for library in order:
                value = run_child(name, library)
                results.setdefault((name, library), []).append(value)
                print(f"round {round_ + 1} {name:13} {library:14} {value:12.4g}", flush=True)
    lines = [f"`python bench/bench_transports.py --rounds {args.rounds}` on {os.cpu_count()} CPUs, Python "
             f"{sys.version.split()[0]}, {time.strftime('%Y-%m-%d %H:%M')}; medians of the rounds; ratio = "
             "fibercore / multiprocessing with that start method.", "",
             "| measure | unit | tcp (built-in) | nng | mp fork | mp spawn | tcp / fork | nng / fork | tcp / spawn "
             "| nng / spawn | better |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in args.measures:
        title, unit, better = MEASURES[name]
        med = {lib: statistics.median(results[(name, lib)]) for lib in LIBRARIES}
        ratios = [med[ours] / med[theirs] for theirs in ("mp fork", "mp spawn") for ours in ("fibercore tcp",
                                                                                              "fibercore nng")]
        lines.append(f"| {title} | {unit} | {med['fibercore tcp']:.4g} | {med['fibercore nng']:.4g} | "
                     f"{med['mp fork']:.4g} | {med['mp spawn']:.4g} | "
                     + " | ".join(f"{r:.2f}x" for r in ratios) + f" | {better} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.report:
        with open(args.report + ".md", "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
