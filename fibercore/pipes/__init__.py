"""The rooms behind ``Pipe()``'s ends (:mod:`fibercore.connection` is their thin API).

A message reaches the other end by one of three delivery paths, each a module:

* :mod:`~fibercore.pipes.memory`: both ends in the process that created the pipe, and
  neither sent away: the sender appends to the reader's inbox (as fast as an OS pipe).
* :mod:`~fibercore.pipes.network`: otherwise, over the transport: a connected end sends
  on an idle line itself (its lane), bursts through its sender thread, and receives on
  the lane or from the channel.
* :mod:`~fibercore.pipes.readiness`: an end whose ``fileno()`` was used (``select``,
  ``wait()``) has a thread receive for it and a descriptor readable while messages wait.

:mod:`~fibercore.pipes.inbox` holds what an end received and not yet read, and its
end-of-pipe flags; :mod:`~fibercore.pipes.home` the listening side of each pipe in its
creator. Each path is given the inbox; none reaches into another.
"""

#: The ops of a pipe's messages: an object (pickled), bytes as sent, the end closing.
OBJ, BYTES, CLOSE = 1, 2, 3

__all__ = ["BYTES", "CLOSE", "OBJ"]
