"""Delivery in memory: both ends in the pipe's creator, neither sent away nor connected.

The sender appends to the reader's inbox under the home's condition and wakes it: as
fast as an OS pipe, and readable at once, as multiprocessing's pipes are.
"""

from __future__ import annotations

import os
from typing import Any

from fibercore.pipes.home import PipeEnd, PipeHome, homes
from fibercore.pipes.inbox import Message, wait_a_step


def local_peer(end: PipeEnd) -> tuple[PipeHome, PipeEnd] | None:
    """The other end while both are here, in the creator, and neither went elsewhere."""
    if not end._stays_here() or os.getpid() != end._creator_pid:
        return None
    home = homes.get(end._pipe_id)
    if home is None or home.shared:
        return None
    peer = home.end(1 - end._side)
    if peer is None or not peer._stays_here():
        return None
    return home, peer


def hand_over(home: PipeHome, peer: PipeEnd, op: int, parts: list[Any]) -> None:
    """Put one message in ``peer``'s inbox and wake its reader."""
    if peer._closed:
        raise BrokenPipeError("the other end of the pipe is closed")
    with home.arrived:
        peer._inbox.deliver(op, [bytes(p) if isinstance(p, memoryview) else p for p in parts])
        home.arrived.notify_all()


def wait_here(end: PipeEnd, deadline: float | None) -> Message | None:
    """The next message handed over in memory; None once the other end went elsewhere (then
    messages come over the network). EOFError when the other end closed, TransportTimeout
    past ``deadline``."""
    local = local_peer(end)
    while local is not None:
        home, peer = local
        with home.arrived:
            if end._inbox:
                return end._inbox.take()
            wait_a_step(home.arrived, deadline, ended=peer._closed, step=0.1)
        local = local_peer(end)  # the other end may have been sent away meanwhile
    return None


def wake_reader(local: tuple[PipeHome, PipeEnd]) -> None:
    """This end closed: a reader of the other end, here, learns of the EOF now."""
    home, peer = local
    with home.arrived:
        home.arrived.notify_all()
    if peer._inbox.ready is not None:
        peer._inbox.ready.set()


__all__ = ["hand_over", "local_peer", "wait_here", "wake_reader"]
