"""Job targets of the conformance suite: module-level functions that every backend's
workers import by reference. No pytest here: worker images need not have it.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import fibercore as fc


def exit_with(code: int) -> None:
    sys.exit(code)


def raise_error(message: str) -> None:
    raise RuntimeError(message)


def sleep_for(seconds: float) -> None:
    time.sleep(seconds)


def burn_cpu(seconds: float) -> None:
    """Compute (not sleep) for ``seconds``: CPU time a backend's usage reading must see."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(range(1000))


def print_marker(marker: str) -> None:
    print(marker, flush=True)
    print(marker + "-stderr", file=sys.stderr, flush=True)


def report_environment(q: Any) -> None:
    rt = fc.get_runtime()
    q.put({
        "backend": rt.backend,
        "session": rt.session,
        "name": fc.current_process().name,
        "parent": getattr(fc.parent_process(), "name", None),
        "secret_in_env": "FIBER_SECRET" in os.environ,
        "start_timeout": rt.config.get("start_timeout"),
    })


def produce(q: Any, start: int, count: int) -> None:
    for i in range(start, start + count):
        q.put(i)


def consume(q: Any, out: Any, count: int) -> None:
    out.put(sorted(q.get(timeout=60) for _ in range(count)))


def echo_pipe(conn: Any) -> None:
    while True:
        try:
            item = conn.recv()
        except EOFError:
            return
        if item is None:
            conn.close()
            return
        conn.send(item)


def spawn_grandchild(q: Any) -> None:
    p = fc.Process(target=report_environment, args=(q,))
    p.start()
    p.join(60)
    q.put(p.exitcode)


def fill_shared(d: Any, q: Any) -> None:
    d[fc.current_process().name] = os.getpid()
    q.put("filled")


def ring_report(rank: int, size: int) -> None:
    from fibercore import ring

    me = ring.current()
    _ring_out.put((rank, size, me.master_addr if me else None))


_ring_out: Any = None


def ring_init(out: Any) -> None:
    global _ring_out
    _ring_out = out


def triple(x: int) -> int:
    return 3 * x


def slow_triple(x: int) -> int:
    time.sleep(0.01)
    return 3 * x


def triple_after(x: int, delay: float) -> int:
    time.sleep(delay)
    return 3 * x


def sync_party(lock: Any, go: Any, barrier: Any, counter: Any, n: int) -> None:
    """Wait for ``go``, add ``n`` to ``counter`` one by one under ``lock``, meet at ``barrier``."""
    if not go.wait(120):
        raise RuntimeError("the go event was never set")
    for _ in range(n):
        with lock:
            counter.value += 1
    barrier.wait()


def print_then_sleep(marker: str, seconds: float) -> None:
    print(marker, flush=True)
    time.sleep(seconds)


def read_shared(handle: Any, i: int) -> tuple[str, int, float]:
    """(machine, pid, element ``i``) of the array a :func:`fibercore.shared` handle holds."""
    from fibercore.util import machine_identity

    return machine_identity(), os.getpid(), float(handle.value[i])


def ps_rounds(ps: Any, n: int, delay: float = 0.0, out: Any = None) -> list[tuple[str, int, float]]:
    """``n`` parameter-server rounds: pull (checking every element of ``w`` is the same), wait
    ``delay``, push ones; (machine, version, w[0]) of each pull, also put on ``out`` (a Queue)."""
    import numpy as np

    from fibercore.util import machine_identity

    seen = []
    for _ in range(n):
        params, version = ps.pull(timeout=120)
        w = params["w"]
        if not (w == w[0]).all():
            raise AssertionError(f"version {version}: a torn read ({w.min()} .. {w.max()})")
        seen.append((machine_identity(), version, float(w[0])))
        time.sleep(delay)
        ps.push({"w": np.ones_like(w)})
    if out is not None:
        out.put(seen)
    return seen


def queue_echo(inbox: Any, outbox: Any) -> None:
    """Put back what comes in ``inbox`` until None."""
    for item in iter(inbox.get, None):
        outbox.put(item)


def where_am_i(delay: float = 0.0) -> str:
    """This machine's host name, after ``delay`` seconds."""
    import socket

    time.sleep(delay)
    return socket.gethostname()
