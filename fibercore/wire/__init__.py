"""The wire: how every byte crosses between fibercore processes (docs/security.md).

One module per job:

- :mod:`~fibercore.wire.handshake` — connection authentication (mutual challenge–response)
  and each connection's keys; the limits on what an unauthenticated peer may cost;
- :mod:`~fibercore.wire.admission` — which unauthenticated connections wait, which are shed;
- :mod:`~fibercore.wire.frames` — frame encoding, sealing and opening (tags, counters);
- :mod:`~fibercore.wire.channel` — an endpoint whose peers are authenticated sessions;
- :mod:`~fibercore.wire.sender` — sending from the caller's thread when idle, batching bursts.

The message protocols built on channels are documented beside their code:
admin (:mod:`fibercore.admin`), pool (:mod:`fibercore.pool.protocol`), queues
(:mod:`fibercore.queues`), pipes (:mod:`fibercore.connection`), managers
(:mod:`fibercore.managers`).
"""

from fibercore.wire.channel import Channel
from fibercore.wire.frames import BadFrame, Message, malformed, stats
from fibercore.wire.handshake import Authenticator, HandshakeFailed, Limits, Session
from fibercore.wire.sender import Sender

__all__ = ["Authenticator", "BadFrame", "Channel", "HandshakeFailed", "Limits", "Message", "Sender",
           "Session", "malformed", "stats"]
