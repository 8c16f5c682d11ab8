"""A parameter server with a staleness knob: BSP, bounded staleness, asynchronous.

::

    ps = fibercore.ParameterServer({"w": np.zeros(8)}, staleness=0, lr=0.05)

    def worker(ps):                       # a Process, a Pool task: any job
        for _ in range(rounds):
            params, version = ps.pull()   # waits while this worker is too far ahead
            ps.push({"w": gradient(params["w"])})

The parameters live in the creating process, as one object of its synchronization
service (:mod:`fibercore.sync.service`): a pull that must wait is a parked request, not
a thread, so a thousand waiting workers cost a thousand small records; a worker's
process that dies is noticed by its connection closing and is no longer waited for.
The rules are in :mod:`fibercore.paramserver.rules`; docs/parameter-server.md says them
for users.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Iterator, Mapping
from typing import Any

try:
    import numpy  # noqa: F401  (the parameters are numpy arrays)
except ImportError as exc:  # pragma: no cover - numpy is in every environment the tests build
    raise ImportError("fibercore.ParameterServer needs numpy: pip install 'fibercore[paramserver]' "
                      "(or numpy)") from exc

from fibercore.paramserver.board import BoardRef, here
from fibercore.paramserver.relay import HostRef
from fibercore.paramserver.rules import Aggregate, Apply, Params, ParamState, mean, sgd
from fibercore.sync.handles import Handle, _local, service


def _read_only(params: Params) -> Params:
    """Views the caller cannot write through (in the creating process they are the server's own arrays)."""
    out = {}
    for k, v in params.items():
        view = v.view()
        view.flags.writeable = False
        out[k] = view
    return out


class ParameterServer(Handle):
    """Named numpy parameters that workers pull, and push gradients to.

    ``staleness``: 0 (BSP: a version is published once every worker's gradient of the round
    is in), S > 0 (a worker may be at most S rounds ahead of the slowest; each gradient is
    applied as it comes) or -1 (asynchronous: nothing waits). ``lr``: the step of the default
    update, ``params - lr * update``; ``aggregate(gradients) -> update`` (default: the mean)
    and ``apply(params, update) -> new params`` replace the defaults (they run in the
    creating process, and must return new arrays, not change their arguments).
    ``time_limit``: seconds a round may stay open (BSP), or a worker may wait for slower
    ones (S > 0), before the slow ones are left behind and their late gradients dropped.
    ``workers``: nothing starts before this many workers joined (so that the first rounds
    are not run by whoever came first); afterwards workers join and leave freely.
    ``share_from``: parameters of at least this many bytes in all (default: the
    ``share_arrays_from`` setting, 1 MiB) reach workers on the server's machine through a
    shared-memory board, written once per version (0: never).
    """

    _state_kind = "ParameterServer"
    _staleness: int

    def __init__(self, params: Mapping[str, Any], *, staleness: int = 0, lr: float = 0.01,
                 aggregate: Aggregate | None = None, apply: Apply | None = None,
                 time_limit: float | None = None, workers: int | None = None,
                 share_from: int | None = None) -> None:
        if not isinstance(params, Mapping) or not params:
            raise TypeError("ParameterServer takes a non-empty dict of named arrays, e.g. {'w': np.zeros(8)}")
        if not all(isinstance(k, str) for k in params):
            raise TypeError(f"parameter names must be strings, not {sorted(map(repr, params))}")
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < -1:
            raise ValueError(f"staleness must be 0 (BSP), a positive bound, or -1 (asynchronous), not {staleness!r}")
        if time_limit is not None and not (isinstance(time_limit, numbers.Real) and time_limit > 0):
            raise ValueError(f"time_limit must be a positive number of seconds or None, not {time_limit!r}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise ValueError(f"workers must be a positive int or None, not {workers!r}")
        if not isinstance(lr, numbers.Real):
            raise TypeError(f"lr must be a number, not {type(lr).__name__}")
        if share_from is None:
            from fibercore.runtime import get_runtime

            share_from = int(get_runtime().config.get("share_arrays_from"))
        svc = service()
        self._staleness = staleness
        self._create(ParamState(params, staleness, aggregate or mean, apply or sgd(float(lr)),
                                None if time_limit is None else float(time_limit), workers=workers or 0,
                                share_from=max(0, int(share_from)), call_later=svc.call_later, name_of=svc.name_of))

    def _extra(self) -> tuple[Any, ...]:
        return (self._staleness,)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        self._staleness = int(extra[0])

    def _answer(self, params: Params | BoardRef | HostRef, version: int) -> tuple[Params, int]:
        if isinstance(params, BoardRef):  # on the server's machine: read from the board
            got = params.read()
            if got is not None:
                return got, version
            return self.params()  # overwritten meanwhile: a newer version, by the connection
        if isinstance(params, HostRef):  # on another machine: its relay, fetched once there
            got = params.read(self._fetch_version)
            if got is not None:
                return got, version
            return self.params()  # no longer kept by the server: the latest, by the connection
        return (_read_only(params) if _local(self._address) is not None else params), version

    def _fetch_version(self, version: int) -> Params | None:
        got = self._call("version", version)
        return None if got is None else dict(got)

    def _where(self) -> str | None:
        """This machine, for a remote call (the server may answer with the board)."""
        return here() if _local(self._address) is None else None

    # -- workers -------------------------------------------------------------------------------
    def pull(self, timeout: float | None = None) -> tuple[Params, int]:
        """``(params, version)`` for this worker's next round; waits while it is too far
        ahead (``fibercore.TimeoutError`` after ``timeout``). The first call joins."""
        params, version = self._call("pull", self._where(), timeout=timeout, wait=True)
        return self._answer(params, int(version))

    def push(self, gradients: Mapping[str, Any], timeout: float | None = None) -> bool:
        """Hand in this worker's gradient for its round (a dict like the parameters, any
        subset of their names): True once taken, False when it came too late (its round
        went on without it, ``time_limit``); waits while this worker is too far ahead."""
        return bool(self._call("push", dict(gradients), timeout=timeout, wait=True))

    def push_pull(self, gradients: Mapping[str, Any], timeout: float | None = None) -> tuple[Params, int, bool]:
        """``push`` then ``pull`` in one round trip (half the messages of the two calls):
        ``(params, version, accepted)`` for this worker's next round."""
        params, version, accepted = self._call("push_pull", dict(gradients), self._where(), timeout=timeout,
                                               wait=True)
        got, version = self._answer(params, int(version))
        return got, version, bool(accepted)

    def join(self) -> int:
        """Become a worker now (``pull`` and ``push`` join by themselves): this worker's round."""
        return int(self._call("join"))

    def leave(self) -> None:
        """This worker stops: it is no longer waited for (a process that ends leaves too)."""
        self._call("leave")

    @contextlib.contextmanager
    def worker(self) -> Iterator[ParameterServer]:
        """``with ps.worker():`` joins, and leaves at the end, even on an exception: for a
        Pool task, whose worker goes on to other tasks (a member that stopped pulling
        without leaving is waited for until its process ends, or ``time_limit``)."""
        self.join()
        try:
            yield self
        finally:
            self.leave()

    # -- anyone --------------------------------------------------------------------------------
    def params(self, newer_than: int | None = None, timeout: float | None = None) -> tuple[Params, int]:
        """``(params, version)`` without joining; with ``newer_than``, waits for a later version."""
        params, version = self._call("params", newer_than, timeout=timeout, wait=newer_than is not None)
        return self._answer(params, int(version))

    def stats(self) -> dict[str, Any]:
        """Counters: version, round, members, pushed, applied, dropped_late, late, rounds_timed_out..."""
        return dict(self._call("stats"))

    def history(self) -> list[tuple[Any, ...]]:
        """The latest events (join, pull, push, version, round, late, drop, leave), oldest first."""
        return list(self._call("history"))

    def members(self) -> dict[str, int]:
        """Each worker's name and round."""
        return dict(self._call("members"))

    def _local_state(self) -> ParamState:
        """The state itself, in the creating process (for tests and debugging)."""
        svc = _local(self._address)
        assert svc is not None, "only the creating process has the state"
        state = svc.get(self._oid)
        assert isinstance(state, ParamState)
        return state

    @property
    def staleness(self) -> int:
        return self._staleness

    @property
    def version(self) -> int:
        return int(self.stats()["version"])

    def __repr__(self) -> str:
        mode = {0: "BSP", -1: "asynchronous"}.get(self._staleness, f"staleness={self._staleness}")
        return f"<fibercore.ParameterServer {mode} at {self._address} #{self._oid}>"


__all__ = ["ParameterServer", "mean", "sgd"]

