"""The multiprocessing API of queues: ``Queue``, ``JoinableQueue``, ``SimpleQueue``.

A handle pickles to the queue's id and its broker's address; in the creating process it
calls the broker directly, elsewhere this process's :class:`~fibercore.queues.client.Client`.
"""

from __future__ import annotations

import os
import uuid
import weakref
from typing import Any

from fibercore.errors import SerializationError
from fibercore.lifetime import current_pid
from fibercore.queues.broker import Broker, brokers
from fibercore.queues.client import Client, client_for, clients
from fibercore.runtime import adopt_credentials, credentials_for_child, get_runtime
from fibercore.serialization import dumps_or_explain


class Queue:
    """A FIFO queue shared by processes on any backend (``multiprocessing.Queue`` API)."""

    def __init__(self, maxsize: int = 0, *, ctx: Any = None) -> None:
        if maxsize < 0:
            raise ValueError("maxsize must be >= 0")
        self._maxsize = maxsize
        self._qid = uuid.uuid4().hex
        broker = Broker(self._qid, maxsize)
        brokers[self._qid] = broker
        self._address = broker.address
        self._creator = os.getpid()
        self._closed = False
        self._here: tuple[int, Client] | None = None  # (pid, this process's client): _client()
        self._finalizer = weakref.finalize(self, _release, self._qid)

    # -- plumbing -----------------------------------------------------------------------------
    def _local(self) -> Broker | None:
        return brokers.get(self._qid) if current_pid() == self._creator else None

    def _client(self, pid: int) -> Client:
        """This process's client of the queue (``pid``: this process's), kept on the handle:
        a get or put elsewhere than in the creator asks for it."""
        here = self._here
        if here is not None and here[0] == pid:
            return here[1]
        client = client_for(self._address, self._qid, self._maxsize)
        self._here = (pid, client)
        return client

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self._qid, self._address, self._creator, self._maxsize,
                           credentials_for_child()))

    @property
    def _reader(self) -> _ReadyReader:
        """multiprocessing's ``Queue._reader`` as ``concurrent.futures`` uses it: waitable with
        ``multiprocessing.connection.wait`` and ``recv()`` an item (in the creating process)."""
        broker = self._local()
        if broker is None:
            raise AttributeError("Queue._reader exists in the process that created the queue only")
        return _ReadyReader(self, broker.ready_fd())

    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")

    # -- the multiprocessing API ------------------------------------------------------------------
    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        if self._closed:
            self._check_closed()
        try:
            parts = dumps_or_explain(get_runtime().serializer, obj, "an object through a Queue")
        except SerializationError:
            # As multiprocessing's feeder thread: the object is dropped, the error printed,
            # and the queue keeps working (put() itself does not raise there).
            import traceback

            traceback.print_exc()
            return
        pid = current_pid()
        broker = brokers.get(self._qid) if pid == self._creator else None  # _local(), inlined
        if broker is not None:
            broker.put_local(parts, block, timeout)
            return
        self._client(pid).put(parts, self._maxsize > 0, block, timeout)

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, False)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if self._closed:
            self._check_closed()
        if timeout is not None and timeout < 0:
            raise ValueError("'timeout' must be a non-negative number")
        pid = current_pid()
        broker = brokers.get(self._qid) if pid == self._creator else None  # _local(), inlined
        if broker is not None:
            parts = broker.get_local(block, timeout)
        else:
            parts = self._client(pid).get(block, timeout)
        return get_runtime().serializer.loads(parts)

    def get_nowait(self) -> Any:
        return self.get(False)

    def qsize(self) -> int:
        """Items queued or handed to readers and not yet consumed."""
        broker = self._local()
        if broker is not None:
            return broker.qsize_local()
        return self._client(current_pid()).qsize()

    def empty(self) -> bool:
        broker = self._local()
        if broker is None:
            client = self._client(current_pid())
            if client.buffer:
                return False
        return self.qsize() <= 0

    def full(self) -> bool:
        return self._maxsize > 0 and self.qsize() >= self._maxsize

    def close(self) -> None:
        """No more puts from this process; what was put is still delivered."""
        self._closed = True
        client = clients.peek(self._qid)
        if client is not None:
            client.sender.flush(timeout=10.0)

    def join_thread(self) -> None:
        """Wait until everything this process put has been handed to the broker."""
        if not self._closed:
            raise AssertionError("Queue.join_thread() requires close() first")
        client = clients.peek(self._qid)
        if client is not None:
            client.sender.flush()

    def cancel_join_thread(self) -> None:
        """Compatibility: puts are flushed at exit with a bounded wait."""

    def __repr__(self) -> str:
        return f"<fibercore.{type(self).__name__} {self._address} maxsize={self._maxsize}>"


class _ReadyReader:
    """A queue's read side as a connection-like object (``fileno``, ``poll``, ``recv``)."""

    def __init__(self, queue: Queue, fd: int) -> None:
        self._queue, self._fd = queue, fd

    def fileno(self) -> int:
        return self._fd

    def poll(self, timeout: float | None = 0.0) -> bool:
        import select

        return bool(select.select([self._fd], [], [], timeout)[0])

    def recv(self) -> Any:
        return self._queue.get()

    def close(self) -> None:
        pass


class JoinableQueue(Queue):
    """A Queue with ``task_done()`` and ``join()``."""

    def task_done(self) -> None:
        broker = self._local()
        if broker is not None:
            with broker.cv:
                if broker.unfinished <= 0:
                    raise ValueError("task_done() called too many times")
                broker._task_done(1)
            return
        self._client(current_pid()).task_done()

    def join(self) -> None:
        broker = self._local()
        if broker is not None:
            broker.join_local()
            return
        self._client(current_pid()).join()


class SimpleQueue(Queue):
    """An unbounded queue with ``get``, ``put``, ``empty`` and ``close`` only."""

    def __init__(self, *, ctx: Any = None) -> None:
        super().__init__(0)

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self._qid, self._address, self._creator, 0, credentials_for_child()))


def _rebuild(cls: type[Queue], qid: str, address: str, creator: int, maxsize: int,
             credentials: tuple[str, bytes] | None = None) -> Queue:
    adopt_credentials(credentials)
    q = cls.__new__(cls)
    q._qid, q._address, q._creator, q._maxsize, q._closed = qid, address, creator, maxsize, False
    q._here = None
    return q


def _release(qid: str) -> None:
    broker = brokers.pop(qid, None)
    if broker is not None:
        broker.release()
