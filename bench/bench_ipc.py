"""Queue and Pipe throughput and latency, and process start time: fibercore vs multiprocessing.

    python bench/bench_ipc.py            # prints a table of ratios (fibercore / multiprocessing)

Both sides run in this one invocation, on the same machine, with the same payloads.
A benchmark, not a test: nothing here asserts. multiprocessing uses the spawn method;
its child re-imports this module, which imports only the standard library at top level
(fibercore is imported inside functions) so neither side pays for the other's imports.
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time

N_SMALL, N_BIG, RTT_N = 50_000, 200, 2_000


# -- children (module level: both libraries pickle them by reference) -----------------------------
def q_reader(q, done, n):
    for _ in range(n):
        q.get()
    done.put(time.perf_counter())


def pipe_reader(conn, n):
    for _ in range(n):
        conn.recv_bytes()
    conn.send_bytes(b"done")


def echo(conn, n):
    for _ in range(n):
        conn.send_bytes(conn.recv_bytes())


def first_message(q, t0):
    q.put(time.perf_counter() - t0)


# -- measurements ------------------------------------------------------------------------------------
def queue_rate(lib, size, n):
    q, done = lib.Queue(), lib.Queue()
    p = lib.Process(target=q_reader, args=(q, done, n))
    p.start()
    q.put(b"w")  # warm the connection
    payload = b"x" * size
    time.sleep(0.3)
    t0 = time.perf_counter()
    for _ in range(n - 1):
        q.put(payload)
    end = done.get()
    p.join()
    return (n - 1) / (end - t0)


def pipe_rate(lib, size, n):
    a, b = lib.Pipe()
    p = lib.Process(target=pipe_reader, args=(b, n))
    p.start()
    payload = b"x" * size
    time.sleep(0.3)
    t0 = time.perf_counter()
    for _ in range(n):
        a.send_bytes(payload)
    a.recv_bytes()
    dt = time.perf_counter() - t0
    p.join()
    return n / dt


def pipe_rtt(lib, size, n):
    a, b = lib.Pipe()
    p = lib.Process(target=echo, args=(b, n))
    p.start()
    payload = b"x" * size
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        a.send_bytes(payload)
        a.recv_bytes()
        samples.append(time.perf_counter() - t0)
    p.join()
    return statistics.median(samples[n // 10:])


def start_time(lib):
    samples = []
    for _ in range(5):
        q = lib.Queue()
        t0 = time.perf_counter()
        p = lib.Process(target=first_message, args=(q, t0))
        p.start()
        q.get()
        samples.append(time.perf_counter() - t0)
        p.join()
    return statistics.median(samples)


def main():
    import fibercore

    mpc = multiprocessing.get_context("spawn")
    rows = []

    def row(name, unit, f_fiber, f_mp, higher_is_better=True, target=""):
        fv, mv = f_fiber(fibercore), f_mp(mpc)
        ratio = fv / mv
        rows.append((name, unit, fv, mv, ratio, target))
        print(f"{name:38} fibercore {fv:12.1f}  multiprocessing {mv:12.1f} {unit:8}  ratio {ratio:5.2f}  {target}",
              flush=True)

    row("queue 100 B "
        "messages/s", "msg/s", lambda lib: queue_rate(lib, 100, N_SMALL), lambda lib: queue_rate(lib, 100, N_SMALL),
        target="target >= 1.0")
    row("queue 1 MB "
        "messages/s", "msg/s", lambda lib: queue_rate(lib, 1 << 20, N_BIG), lambda lib: queue_rate(lib, 1 << 20, N_BIG),
        target="target >= 1.0")
    row("pipe 100 B "
        "messages/s", "msg/s", lambda lib: pipe_rate(lib, 100, N_SMALL), lambda lib: pipe_rate(lib, 100, N_SMALL),
        target="target >= 1.0")
    row("pipe 1 MB "
        "messages/s", "msg/s", lambda lib: pipe_rate(lib, 1 << 20, N_BIG), lambda lib: pipe_rate(lib, 1 << 20, N_BIG),
        target="target >= 1.0")
    row("pipe 100 B round trip (median)", "us", lambda lib: 1e6 * pipe_rtt(lib, 100, RTT_N),
        lambda lib: 1e6 * pipe_rtt(lib, 100, RTT_N), target="lower is better")
    row("pipe 1 MB round trip (median)", "us", lambda lib: 1e6 * pipe_rtt(lib, 1 << 20, 100),
        lambda lib: 1e6 * pipe_rtt(lib, 1 << 20, 100), target="lower is better")
    row("process start to first message", "ms", lambda lib: 1e3 * start_time(lib), lambda lib: 1e3 * start_time(lib),
        target="target <= 1.2 (spawn)")
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
