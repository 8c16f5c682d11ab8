"""Simulated pool workers for the benchmarks' scale sections: one job plays many workers
(one connection and thread each), speaking the pool's real protocol and answering every task
at once, so that what is measured is the master's own cost at a worker count this machine
could not hold as real processes."""

from __future__ import annotations

import os
import threading
from typing import Any


def _echo(kind: int, items: Any) -> Any:
    """A task's answer: its items (a map's chunk comes back as it went)."""
    from fibercore.pool import protocol as P

    return items if kind != P.APPLY else None


def _es_pairs(kind: int, items: Any) -> Any:
    """An ES evaluation's answer: a fitness pair per item."""
    return [(0.0, 0.0)] * len(items)


ANSWERS = {"echo": _echo, "es_pairs": _es_pairs}


def serve_as_workers(address: str, wids: list[int], answer: str = "echo") -> None:
    """Connect as the pool workers ``wids`` of the pool at ``address`` and answer its tasks
    (``answer``: a name in :data:`ANSWERS`) until the pool closes the connections."""
    from fibercore.errors import TransportClosed
    from fibercore.pool import protocol as P
    from fibercore.runtime import get_runtime

    rt = get_runtime()
    ser = rt.serializer
    reply = ANSWERS[answer]

    def client(wid: int) -> None:
        ch = rt.dial("router", address, service="pool")
        ch.send([(P.READY, [str(wid).encode(), str(os.getpid()).encode()])])
        while True:
            try:
                messages, _ = ch.recv()
            except TransportClosed:
                return
            out = []
            for op, parts in messages:
                if op == P.TASK:
                    cid, _bid, kind, nfunc = P.read_task_header(parts[0])
                    value = reply(kind, ser.loads(parts[1 + nfunc:]))
                    out.append((P.RESULT, [P.result_header(cid, True, 1), *ser.dumps(value)]))
                elif op in (P.STOP, P.STEAL):
                    out.append((P.RETURNED, [P.ids([])]))
            if out:
                ch.send(out)

    threads = [threading.Thread(target=client, args=(w,), daemon=True) for w in wids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
