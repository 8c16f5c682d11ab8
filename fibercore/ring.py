"""``Ring``: a group of jobs that know their rank, size and a rendezvous address.

For torch.distributed-style training (the Fiber blog's Ring): every member,
rank 0 included, is a job on the selected backend. Rank 0 reserves a port on its
own reachable address (bound by the OS, ``SO_REUSEADDR``, kept until the member's
function returns, so nothing else takes it) and the others learn it through a
queue. Before the initializer runs, each member has ``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR`` and ``MASTER_PORT`` in its environment, so
``torch.distributed.init_process_group("gloo")`` works as written.

``run()`` starts all members and waits; when one fails, the others are stopped and
``run()`` raises :class:`~fibercore.errors.ProcessError` naming the member, its exit
status and its logs, instead of leaving the survivors hanging in a collective.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from fibercore.errors import ProcessError
from fibercore.util import log_tail

_current: RingMember | None = None


@dataclass(frozen=True)
class RingMember:
    """What a member knows: its rank, the ring's size and the rendezvous address."""

    rank: int
    size: int
    master_addr: str
    master_port: int


def current() -> RingMember | None:
    """The ring membership of this job (None outside a ring member)."""
    return _current


def _reserve_port(host: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


def _member(rank: int, size: int, rendezvous: Any, func: Callable[[int, int], Any],
            initializer: Callable[..., Any] | None, initargs: tuple[Any, ...]) -> None:
    """The body of every ring job."""
    global _current
    from fibercore.runtime import get_runtime

    reserved = None
    if rank == 0:
        host = get_runtime().listen_host
        reserved = _reserve_port(host)
        port = reserved.getsockname()[1]
        for _ in range(size - 1):
            rendezvous.put((host, port))
    else:
        host, port = rendezvous.get(timeout=float(get_runtime().config.get("start_timeout")))
    _current = RingMember(rank, size, host, port)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": "0",
                       "MASTER_ADDR": host, "MASTER_PORT": str(port)})
    try:
        if initializer is not None:
            initializer(*initargs)
        func(rank, size)
    finally:
        if reserved is not None:
            reserved.close()


class Ring:
    """``processes`` jobs running ``func(rank, size)`` after ``initializer(*initargs)``."""

    def __init__(self, processes: int, func: Callable[[int, int], Any],
                 initializer: Callable[..., Any] | None = None, initargs: Iterable[Any] = ()) -> None:
        if not isinstance(processes, int) or processes < 1:
            raise ValueError("a Ring needs at least 1 process")
        if not callable(func):
            raise TypeError("func must be callable as func(rank, size)")
        self.size = processes
        self.func = func
        self.initializer = initializer
        self.initargs = tuple(initargs)
        self.members: list[Any] = []

    def run(self, timeout: float | None = None) -> None:
        """Start every member, wait for all; raise ProcessError if one fails (others are stopped)."""
        from multiprocessing.connection import wait

        from fibercore import Process, Queue

        rendezvous = Queue()
        self.members = [
            Process(target=_member, name=f"Ring-{rank}",
                    args=(rank, self.size, rendezvous, self.func, self.initializer, self.initargs))
            for rank in range(self.size)
        ]
        for p in self.members:
            p.launch()
        try:
            for p in self.members:
                p.wait_started()
            deadline = None if timeout is None else time.monotonic() + timeout
            # Wait on the members' sentinels, so that the member that failed first is the
            # one reported: when one dies, the others then fail in their collectives.
            waiting = {p.sentinel: rank for rank, p in enumerate(self.members)}
            while waiting:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise ProcessError(f"the Ring did not finish within {timeout} s; its members were stopped")
                for fd in wait(list(waiting), remaining):
                    rank = waiting.pop(fd)
                    member = self.members[rank]
                    member.join()
                    if member.exitcode != 0:
                        raise ProcessError(
                            f"Ring member {rank} of {self.size} failed with exit code {member.exitcode}; the "
                            f"other members were stopped.\n  its logs:\n{log_tail(member.logs())}")
        except BaseException:
            for p in self.members:
                if p.launched and p.exitcode is None:
                    p.kill()
            for p in self.members:
                if p.launched:
                    p.join(10)
            raise


__all__ = ["Ring", "RingMember", "current"]
