"""Socket options of the built-in transport's connections: keepalive that notices a silent
peer, no Nagle delay, and a Unix socket's send buffer."""

from __future__ import annotations

import socket

#: Bytes a Unix connection may queue towards its reader (the kernel caps it at net.core.wmem_max).
UNIX_SEND_BUFFER = 4 << 20
#: How long a TCP peer may be silent before its connection is closed, by default (each
#: transport takes the configuration's ``heartbeat_timeout``): a peer whose machine is lost
#: or cut off (no FIN ever comes) is noticed then, so its locks are released, its pool tasks
#: rerun and a Pipe waiting on it raises instead of hanging. A process that dies is noticed
#: at once: its kernel closes the socket.
DEFAULT_SILENCE = 20.0


def keepalive_timers(bound: float) -> dict[str, int]:
    """Keepalive options that close an idle connection whose peer stopped answering for about
    ``bound`` seconds: the first probe after half of it, then three more. (Not
    ``TCP_USER_TIMEOUT``: Linux applies it to a zero window too, and would cut a live reader
    that is only slow, where multiprocessing blocks.)"""
    bound = min(max(bound, 2.0), 60000.0)  # the kernel's limits: KEEPIDLE and KEEPINTVL <= 32767
    idle = max(1, round(bound / 2))
    return {"TCP_KEEPIDLE": idle, "TCP_KEEPINTVL": max(1, round((bound - idle) / 3)), "TCP_KEEPCNT": 3}


def tcp_options(sock: socket.socket, silence: float = DEFAULT_SILENCE) -> None:
    """No Nagle delay (frames are already batched), and keepalive (:func:`keepalive_timers`)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in keepalive_timers(silence).items():
        option = getattr(socket, name, None)
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass


def large_send_buffer(sock: socket.socket) -> None:
    """Let a Unix socket hold a whole batch (:data:`UNIX_SEND_BUFFER`): a write that must wait
    for the reader costs its thread a GIL switch (up to 5 ms in a busy process) per part."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
    except OSError:  # capped by net.core.wmem_max: the kernel keeps what it allows
        pass
