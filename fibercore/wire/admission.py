"""Admission before authentication: whom a listener lets wait for a handshake, shared by transports.

A listener keeps at most ``Limits.max_pending`` unauthenticated connections,
``Limits.max_pending_per_peer`` of them per peer identity (:func:`peer_identity`: a uid on
Unix sockets, an address on TCP, and every loopback address, 127.0.0.0/8 and ::1, one
peer: another local user can bind any of them, while a local job of the same user takes
the uid-checked Unix path on the built-in transport). At a limit, :func:`make_room` sheds
the OLDEST unauthenticated connection of the peer at its limit, or of the peer holding the
most, or of anyone when every peer holds its share: a connection held without a proof gets
older, a legitimate handshake ends within a round trip, so the oldest is the one to close.
A connection younger than :data:`SHED_AGE` is never shed (a handshake in progress on a
loaded machine): when all are that young, the newcomer is refused and its dialer retries.
"""

from __future__ import annotations

import collections
import ipaddress
from collections.abc import Hashable, Sequence
from typing import TypeVar

from fibercore.wire.handshake import Limits

#: Seconds an unauthenticated connection is safe from being shed to make room for another.
SHED_AGE = 1.0

#: The one peer identity every loopback address has.
LOOPBACK = "loopback"

K = TypeVar("K")


def peer_identity(host: str) -> str:
    """The identity whose budget a TCP connection from ``host`` uses: its address, except that
    every loopback address (127.0.0.0/8, ::1, IPv4-mapped 127.x) is :data:`LOOPBACK`."""
    text = host.strip("[]").split("%", 1)[0]
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return text
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return LOOPBACK if ip.is_loopback else str(ip)


def make_room(pending: Sequence[tuple[K, Hashable, float | None]], newcomer: Hashable | None,
              limits: Limits, now: float) -> tuple[bool, K | None]:
    """Whether one more unauthenticated connection from ``newcomer`` may wait, and which
    pending one to close first to let it (None: none need go).

    ``pending``: (key, peer identity, when it connected or None if it must never be shed),
    oldest first. ``newcomer`` None: only shed the oldest (the process is out of descriptors)."""
    if newcomer is None:
        victim = _oldest(pending, now)
        return victim is not None, victim
    mine = [entry for entry in pending if entry[1] == newcomer]
    if len(mine) >= limits.max_pending_per_peer:
        victim = _oldest(mine, now)
        return victim is not None, victim
    if len(pending) < limits.max_pending:
        return True, None
    counts = collections.Counter(who for _, who, _ in pending)
    greedy, held = counts.most_common(1)[0]
    if held > len(mine) + 1:  # one peer holds more than the newcomer would: its oldest first
        victim = _oldest([entry for entry in pending if entry[1] == greedy], now)
        if victim is not None:
            return True, victim
    victim = _oldest(pending, now)  # every peer holds its share: the oldest of all
    return victim is not None, victim


def _oldest(entries: Sequence[tuple[K, Hashable, float | None]], now: float) -> K | None:
    for key, _, since in entries:
        if since is not None and now - since >= SHED_AGE:
            return key
    return None
