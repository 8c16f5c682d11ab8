"""``SimpleQueue``, ``Queue`` and ``JoinableQueue`` shared by any number of jobs.

A queue lives in a broker in the process that created it; every other process
talks to the broker over one authenticated ``router`` connection::

    writer process                    creator process                     reader process
    put() ─▶ Sender thread ═PUT═▶  broker: receiver thread ─▶ items  ◀═GET(want)═ get()
            (batches items)                dispatcher thread ═ITEMS═▶ buffer ─▶ get()
                                           ◀═RETURN══ (on RECALL)

Exactly once, with batching:
  1. writers pack many items per frame (``put`` returns at once, as mp's feeder);
  2. a reader asks for items when its local buffer is empty; the broker grants a
     fair share (enough to amortise a round trip, never more than half of the
     backlog per reader) and keeps them *leased* to that reader;
  3. the reader acknowledges what it consumed in its next request (or, after
     ``QUIET`` seconds without one, from its background thread);
  4. when another reader waits on an empty queue with nothing lent to it, the broker
     RECALLs leased but unconsumed items, and the holder RETURNs them (they go back to
     the front); nothing more is lent to a reader until it answered its RECALL, and the
     RETURN withdraws its GET (it asks again if it still wants items);
  5. a reader whose connection drops has its unacknowledged items put back;
  6. a blocking ``get``'s GET *stands* while its process is the queue's only reader and
     keeps up: each item put then goes to it at once (no GET per item), and it
     acknowledges with ACK every few items; the broker ends it (DONE) when another reader
     comes, items are left over, or too many lent items are unacknowledged.
The creator's own ``put``/``get`` touch the broker directly (no network).
``qsize()`` counts queued and leased items, so it is exact when readers are idle.
A queue lives as long as the process that created it.

The package, a room per job: :mod:`.protocol` (the ops and their encoding),
:mod:`.broker` (the queue's state in its creator), :mod:`.client` (a process's connection
to a broker elsewhere, and the bounded put), :mod:`.api` (the multiprocessing classes).
"""

from __future__ import annotations

from fibercore.queues.api import JoinableQueue, Queue, SimpleQueue
from fibercore.queues.protocol import GRANT_BYTES, MAX_GRANT, PUT, Empty, Full

__all__ = ["GRANT_BYTES", "MAX_GRANT", "PUT", "Empty", "Full", "JoinableQueue", "Queue", "SimpleQueue"]
