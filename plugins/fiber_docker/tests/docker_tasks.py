"""Functions the docker tests run in containers (importable there: the checkout is
mounted at the same path, and the master's sys.path travels with each job)."""

from __future__ import annotations

import os
import time
from typing import Any


def square(x: int) -> int:
    time.sleep(0.02)
    return x * x


def container_facts(q: Any) -> None:
    """What a job sees of its container: limits, mounts, identity."""

    def read(path: str) -> str | None:
        try:
            with open(path) as fh:
                return fh.read().strip()
        except OSError:
            return None

    q.put({
        "cwd": os.getcwd(),
        "cfs_quota": read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") or read("/sys/fs/cgroup/cpu.max"),
        "mem_limit": read("/sys/fs/cgroup/memory/memory.limit_in_bytes") or read("/sys/fs/cgroup/memory.max"),
        "secret_file": os.environ.get("FIBER_SECRET_FILE"),
        "in_container": os.path.exists("/.dockerenv"),
        "hostname": os.uname().nodename,
        "default_gateway": default_gateway(),
    })
    time.sleep(float(os.environ.get("HOLD", "0") or 0))


def default_gateway() -> str | None:
    """The container's default route (from the kernel's table): where it reaches the host."""
    import socket
    import struct

    try:
        with open("/proc/net/route") as fh:
            rows = [line.split() for line in fh.readlines()[1:]]
    except OSError:
        return None
    for row in rows:
        if len(row) > 2 and row[1] == "00000000":
            return socket.inet_ntoa(struct.pack("<L", int(row[2], 16)))
    return None


def read_and_write(path: str, q: Any) -> None:
    with open(path) as fh:
        content = fh.read()
    try:
        with open(path, "a") as fh:
            fh.write("x")
        wrote = True
    except OSError:
        wrote = False
    q.put((content, wrote))


def hold(seconds: float) -> None:
    time.sleep(seconds)


def eat_memory(mib: int) -> None:
    blocks = []
    for _ in range(mib):
        blocks.append(bytearray(1024 * 1024))
        blocks[-1][::4096] = b"x" * len(blocks[-1][::4096])
    time.sleep(1)


def count_both(lock: Any, counter: Any, synced: Any, n: int) -> None:
    """``n`` increments under ``lock``, then ``n`` through ``synced``'s own lock."""
    for _ in range(n):
        with lock:
            counter.value += 1
    for _ in range(n):
        with synced.get_lock():
            synced.value += 1


def shm_visible(value: Any, out: Any) -> None:
    """Whether this container maps the master's shared memory (it should not: its own /dev/shm)."""
    out.put(value._local is not None)


def shared_in_container(handle: Any, out: Any) -> None:
    """What a container sees of a shared object: its value, and the copy in its own /dev/shm."""
    import os

    value = handle.value
    copies = sorted(n for n in os.listdir("/dev/shm") if n.startswith("fcs-"))
    out.put((bytes(value["blob"][:4]), len(value["blob"]), value["name"], copies, handle._map_here() is None))
