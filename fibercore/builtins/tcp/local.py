"""The same-machine path: a listener also answers on an abstract Unix socket named after its
identity, and only its own user's processes are let in (the kernel says who connected)."""

from __future__ import annotations

import errno
import socket
import struct
import sys

from fibercore.errors import TransportError
from fibercore.wire.handshake import Authenticator

#: Also listen on an abstract Unix socket named after the listener's identity, for peers of
#: the same user in this network namespace (Linux only; never with TLS).
LOCAL_SOCKETS = sys.platform.startswith("linux")


def local_name(identity: bytes) -> str:
    """The abstract Unix socket name of the listener with this identity (Linux).

    Unguessable before the listener binds it (the identity is 16 random bytes), so no
    other user can take it first; who connects is checked by its uid (:func:`peer_uid`).
    """
    return f"\0fibercore-{identity.hex()}"


def peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (-1: unknown)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return -1
    return int(struct.unpack("3i", creds)[1])


#: Seconds a dialer waits for the same-machine Unix socket to take its connection before it
#: uses TCP (a backlog that never drains). Its handshake then has the usual handshake_timeout:
#: the listener is our own user's (checked), and a busy master is slow, not hostile.
LOCAL_DEADLINE = 2.0


def bind_local(auth: Authenticator) -> socket.socket | None:
    """The listener's same-machine Unix socket, named after its identity (a name that is
    taken, which no one could have guessed, makes the listener draw a new identity); None
    where there are no abstract sockets (TCP only: the address says so)."""
    for _ in range(3):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(local_name(auth.identity))
            sock.listen(512)
            sock.setblocking(False)
            return sock
        except OSError as exc:
            sock.close()
            if exc.errno != errno.EADDRINUSE:
                return None
            auth.new_identity()
    raise TransportError("three random Unix socket names in a row were taken: another process on this "
                         "machine is binding fibercore's names; find it with `ss -xlp | grep fibercore`")
