"""The floor of a Pipe step: fibercore's layers against the same work with the layers fused.

One child echoes a CartPole-sized observation for each small int the master sends, pinned to
one CPU so that what is measured is CPU, not the wake-up of an idle one. Three variants, each
in a fresh process: fibercore as it is, multiprocessing fork, and an *experiment* that keeps
fibercore's wire (the same Unix socket, sealed frames with their counter, record headers, the
same serializer) but writes and reads it straight from ``Connection.send``/``recv``. The
experiment reaches into private attributes and skips the checks that keep order and EOF right
(a second sender thread, a frame read in pieces, a peer that left); its master blocks in
``recv`` where the layers poll the socket and a wake-up pipe. It is a measure of what the
layers cost, not a path to use.

    taskset -c 0 python bench/pipe_floor.py [round_trips]

Prints each variant's round trip and each side's user and system time per round trip (from
``/proc``, clock ticks over the whole run).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any


def echo(conn: Any, fused: bool) -> None:
    """The child: answer each int with an observation, until None."""
    import numpy as np

    conn.send("ready")  # connect through the layers first
    if fused:
        _fuse()
    obs = np.zeros(4, dtype=np.float32)
    while conn.recv() is not None:
        conn.send((obs, 1.0, False, False))


def _line(conn: Any) -> tuple[Any, Any, Any, bytearray, Any]:
    """A connected end's socket, sealer, opener, read buffer and serializer (private parts)."""
    line = getattr(conn, "_floor_line", None)
    if line is None:
        from fibercore.runtime import get_runtime

        lane = conn._network.current_lane()
        endpoint = lane.channel.endpoint
        tcp = endpoint._conn if hasattr(endpoint, "_conn") else endpoint._peers[lane.session]
        line = conn._floor_line = (tcp.sock, lane.session.sealer, lane.session.opener, bytearray(1 << 16),
                                   get_runtime().serializer)
    return line


def _fused_send(conn: Any, obj: Any) -> None:
    from fibercore.pipes import OBJ

    sock, sealer, _, _, serializer = _line(conn)
    frame = sealer.seal([(OBJ, serializer.dumps(obj))])
    size = sum(p.nbytes if type(p) is memoryview else len(p) for p in frame)
    sock.sendmsg([size.to_bytes(4, "little"), *frame])


def _fused_recv(conn: Any) -> Any:
    sock, _, opener, scratch, serializer = _line(conn)
    n = sock.recv_into(scratch)
    size = int.from_bytes(scratch[:4], "little")
    if n != 4 + size:
        raise RuntimeError("a frame came in pieces: the experiment does not handle it")
    return serializer.loads(opener.open(memoryview(scratch[4:n]))[0][1])


def _fuse() -> None:
    from fibercore import connection

    connection.Connection.send = _fused_send  # type: ignore[method-assign]
    connection.Connection.recv = _fused_recv  # type: ignore[method-assign]


def _times(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]), int(fields[12])


def run(variant: str, steps: int) -> None:
    """One variant in this process: print its round trip and CPU per round trip."""
    import multiprocessing

    import fibercore

    lib: Any = multiprocessing.get_context("fork") if variant == "fork" else fibercore
    a, b = lib.Pipe()
    child = lib.Process(target=echo, args=(b, variant == "fused"), daemon=True)
    child.start()
    b.close()
    assert a.recv() == "ready"
    if variant == "fused":
        _fuse()
    for _ in range(2000):
        a.send(1)
        a.recv()
    pids = [os.getpid(), child.pid]
    before = [_times(p) for p in pids]
    started = time.perf_counter()
    for _ in range(steps):
        a.send(1)
        a.recv()
    elapsed = time.perf_counter() - started
    after = [_times(p) for p in pids]
    a.send(None)
    child.join(10)
    tick = os.sysconf("SC_CLK_TCK")
    per = [((x[0] - y[0]) / tick / steps * 1e6, (x[1] - y[1]) / tick / steps * 1e6)
           for y, x in zip(before, after, strict=True)]
    cpu = f"master user {per[0][0]:4.1f} sys {per[0][1]:4.1f}  child user {per[1][0]:4.1f} sys {per[1][1]:4.1f}"
    print(f"{variant:9} {elapsed / steps * 1e6:5.1f} us per round trip   {cpu}  (us)", flush=True)


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    for variant in ("fibercore", "fork", "fused"):
        subprocess.run([sys.executable, __file__, "--variant", variant, str(steps)], check=True)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--variant":
        run(sys.argv[2], int(sys.argv[3]))
    else:
        main()
