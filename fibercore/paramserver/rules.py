"""The parameter server's rules: one state machine, run by the synchronization service.

Every worker (a thread of a process, from its first ``pull`` or ``push``) has a *clock*:
the round it works on, which its accepted push ends. The *floor* is the lowest clock of
the members (the slowest worker's round). With ``staleness`` S:

* S = 0, bulk synchronous (BSP): a worker's pull and push wait until its clock is the
  floor. A round closes when every member pushed for it: the round's gradients are
  aggregated (their mean by default) and applied once, and the version goes up by one.
  So version v holds every gradient computed on version v - 1.
* S > 0, bounded staleness: a worker waits while its clock is more than S above the
  floor; each gradient is applied as it comes (the version counts gradients applied).
* S = -1, asynchronous: nothing waits; each gradient is applied once, as it comes.

A member leaves by ``leave()``, or when its process's connection closes (it died, or
exited): it is no longer waited for. With ``time_limit`` T, a round open for T seconds
(BSP), or a worker kept waiting T seconds by slower ones (S > 0), goes on without the
slow members: they are marked *late*, moved up to the round the others need, and their
gradient for the round they missed is dropped when it arrives (``push`` returns False),
logged, and counted in ``stats()["dropped_late"]``.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable, Mapping
from typing import Any

import numpy as np

from fibercore.errors import TimeoutError
from fibercore.paramserver.board import SLOTS, Board, BoardRef, here, layout_of
from fibercore.paramserver.relay import HostRef
from fibercore.sync.states import ERROR, PARKED, RETURN, State, Waiter

log = logging.getLogger("fibercore.paramserver")

Params = dict[str, np.ndarray]
Aggregate = Callable[[list[Params]], Params]
Apply = Callable[[Params, Params], Params]
#: Events kept for ``history()`` (each a small tuple).
HISTORY = 100_000
#: The counters ``stats()`` gives, each from 0: what a worker reads without a KeyError.
STAT_KEYS = ("joined", "pushed", "applied", "late", "dropped_late", "members_lost", "rounds_timed_out",
             "board_pulls", "relay_pulls", "pulled_bytes", "host_fetches", "relayed_bytes")


def mean(gradients: list[Params]) -> Params:
    """The default aggregation: each parameter's mean over the gradients."""
    if len(gradients) == 1:
        return gradients[0]
    return {k: np.mean([g[k] for g in gradients], axis=0) for k in gradients[0]}


def sgd(lr: float) -> Apply:
    """The default update: ``params - lr * update`` (new arrays; the old ones are never changed)."""

    def apply(params: Params, update: Params) -> Params:
        return {k: (v - lr * update[k]).astype(v.dtype, copy=False) if k in update else v for k, v in params.items()}

    return apply


class Clocks:
    """The members' clocks as counts, with the lowest found in O(1) (it only goes up: members
    join at the floor, and clocks only grow)."""

    def __init__(self) -> None:
        self.counts: Counter[int] = Counter()
        self.low = 0
        self.top = 0

    def add(self, clock: int) -> None:
        self.counts[clock] += 1
        self.top = max(self.top, clock)

    def remove(self, clock: int) -> None:
        self.counts[clock] -= 1
        if not self.counts[clock]:
            del self.counts[clock]

    def move(self, old: int, new: int) -> None:
        self.remove(old)
        self.add(new)

    def floor(self, default: int) -> int:
        """The lowest clock (``default`` with no members)."""
        if not self.counts:
            return default
        while self.low not in self.counts:
            self.low += 1
            if self.low > self.top:  # never: no clock is below ``low``; recover all the same
                self.low = min(self.counts)
        return self.low


class Member:
    """One worker: a thread of a process, and the round it works on."""

    __slots__ = ("caller", "name", "clock", "late", "pushes", "machine")

    def __init__(self, caller: tuple[Hashable, int], name: str, clock: int) -> None:
        self.caller = caller
        self.name = name
        self.clock = clock
        self.late = False  # moved up past a round it had not pushed: its next push is dropped
        self.pushes = 0
        self.machine: str | None = None  # where it runs (another process on the server's machine reads the board)


class ParamState(State):
    """Parameters, their version, the members and the parked pulls and pushes."""

    kind = "ParameterServer"

    def __init__(self, params: Mapping[str, Any], staleness: int, aggregate: Aggregate, apply: Apply,
                 time_limit: float | None, *, workers: int = 0, share_from: int = 0,
                 call_later: Callable[[float, Callable[[], None]], Any] | None = None,
                 name_of: Callable[[Hashable], str] = repr,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.params: Params = {k: np.array(v) for k, v in params.items()}
        #: Parameters of at least this many bytes go to workers on this machine through the board.
        self.share_from = share_from
        self.board: Board | None = None
        self._board_failed = False
        #: Workers on other machines: the versions handed out through their machines' relay
        #: boards (the last SLOTS), each fetched once per machine; the layout of the first
        #: (a later one of another layout goes through the connection).
        self.relay_tag = os.urandom(16)
        self.kept: deque[tuple[int, Params]] = deque(maxlen=SLOTS)
        self.relay_layout: tuple[Any, int] | None = None
        self.staleness = staleness
        self.aggregate = aggregate
        self.apply = apply
        self.time_limit = time_limit
        self.now = clock
        #: From the service: run a function under its lock later (time limits); name a peer.
        self.call_later = call_later
        self.name_of = name_of
        #: Nothing starts before this many workers joined (then members come and go freely).
        self.workers = workers
        self.started = workers <= 0
        self.version = 0
        self.round = 0  # the floor's lowest value so far (BSP: the open round)
        self.ahead = 0  # BSP: members that pushed for the open round
        self.members: dict[tuple[Hashable, int], Member] = {}
        self.clocks = Clocks()
        self.grads: dict[tuple[Hashable, int], Params] = {}  # BSP: the open round's gradients
        self.opened = self.now()  # when the open round (BSP) began
        self.waiting: list[tuple[Waiter, str, Any, float]] = []  # (waiter, op, argument, since)
        self.watchers: list[tuple[Waiter, int]] = []  # params(newer_than=...) calls
        # Every counter stats() documents is there from the start (0), not only once it counted.
        self.stats: Counter[str] = Counter(dict.fromkeys(STAT_KEYS, 0))
        self.history: deque[tuple[Any, ...]] = deque(maxlen=HISTORY)
        self._arm_round()

    # -- membership ----------------------------------------------------------------------------
    def _member(self, w: Waiter) -> Member:
        m = self.members.get(w.caller)
        if m is None:
            m = Member(w.caller, f"{self.name_of(w.peer)} thread {w.caller[1]}", self.floor())
            self.members[w.caller] = m
            self.clocks.add(m.clock)
            self.stats["joined"] += 1
            self.history.append(("join", m.name, m.clock, self.now()))
            if not self.started and len(self.members) >= self.workers:
                self.started = True
                self.history.append(("start", len(self.members), self.now()))
                self._wake()
        return m

    def floor(self) -> int:
        """The slowest member's round (the open round when no one is a member; BSP: the open
        round, which closes as soon as every member pushed for it)."""
        return self.round if self.staleness == 0 else self.clocks.floor(self.round)

    def _set_clock(self, m: Member, clock: int) -> None:
        self.clocks.move(m.clock, clock)
        m.clock = clock

    def _allowed(self, m: Member, floor: int | None = None) -> bool:
        if not self.started:
            return False
        if self.staleness < 0:
            return True
        return m.clock - (self.floor() if floor is None else floor) <= self.staleness

    def op_join(self, w: Waiter) -> int:
        """Become a member now (else the first pull or push joins): its round."""
        return self._member(w).clock

    def op_leave(self, w: Waiter) -> None:
        self._remove(w.caller, "left")

    def _remove(self, caller: tuple[Hashable, int], why: str) -> None:
        m = self.members.pop(caller, None)
        if m is None:
            return
        self.clocks.remove(m.clock)
        if self.staleness == 0 and m.clock > self.round:
            self.ahead -= 1
        self.history.append(("leave", m.name, m.clock, why, self.now()))
        self.waiting = [x for x in self.waiting if x[0].caller != caller]
        self._settle()
        self._wake()

    def peer_lost(self, peer: Hashable, who: str, abrupt: bool) -> None:
        for caller in [c for c in self.members if c[0] == peer]:
            if abrupt:
                self.stats["members_lost"] += 1
                log.warning("parameter server: %s is gone (its connection closed); it is no longer waited for", who)
            self._remove(caller, "lost" if abrupt else "exited")
        self.watchers = [x for x in self.watchers if x[0].peer != peer]

    # -- the worker's calls ----------------------------------------------------------------------
    def op_pull(self, w: Waiter, machine: str | None = None) -> Any:
        """(params, version) once this worker may start its round. ``machine``: where the
        caller runs (the parameters may then come as a reference to the board)."""
        m = self._member(w)
        m.machine = machine
        if not self._allowed(m):
            return self._park(w, "pull", None)
        return self._pulled(m)

    def _pulled(self, m: Member) -> tuple[Params | BoardRef | HostRef, int]:
        m.late = False
        self.history.append(("pull", m.name, m.clock, self.version, self.now()))
        return self._params_for(m), self.version

    def _params_for(self, m: Member) -> Params | BoardRef | HostRef:
        """The parameters; or, when they are large, where a worker on this machine reads them
        (the board) or where one on another machine finds them (its machine's relay)."""
        if m.machine is None:  # the creating process: its own arrays, read-only views
            return self.params
        if not self.share_from or sum(v.nbytes for v in self.params.values()) < self.share_from:
            return self._sent(self.params)
        if m.machine != here():
            layout = layout_of(self.params)
            if self.relay_layout is None:
                self.relay_layout = layout
            elif layout != self.relay_layout:  # an apply changed a shape or dtype: no board for that
                return self._sent(self.params)
            if not self.kept or self.kept[-1][0] != self.version:
                self.kept.append((self.version, self.params))
            self.stats["relay_pulls"] += 1
            return HostRef(self.relay_tag, self.version, layout[0], layout[1])
        if self._board_failed:
            return self._sent(self.params)
        if self.board is None:
            try:
                self.board = Board(self.params)
            except OSError as exc:  # no /dev/shm, or too small: the connection carries them
                self._board_failed = True
                log.warning("parameter server: parameters go through the connection (no board: %s)", exc)
                return self._sent(self.params)
        if not self.board.fits(self.params):
            return self._sent(self.params)
        self.stats["board_pulls"] += 1
        return self.board.ref(self.board.publish(self.version, self.params), self.version)

    def _sent(self, params: Params) -> Params:
        """``params``, counted as sent through a worker's connection."""
        self.stats["pulled_bytes"] += sum(v.nbytes for v in params.values())
        return params

    def op_version(self, w: Waiter, version: int) -> Params | None:
        """The parameters of ``version`` for the first worker of a machine to need them (it
        writes them into its machine's relay for the others); None when no longer kept."""
        for v, params in self.kept:
            if v == version:
                self.stats["host_fetches"] += 1
                self.stats["relayed_bytes"] += sum(a.nbytes for a in params.values())
                return params
        return None

    def op_push(self, w: Waiter, grads: Mapping[str, Any]) -> Any:
        """Add this worker's gradient for its round: True, or False when it came too late."""
        self._check(grads)
        m = self._member(w)
        if m.late:
            return self._drop(m)
        if not self._allowed(m):
            return self._park(w, "push", grads)
        accepted = self._accept(m, grads)
        self._settle()
        self._wake()
        return accepted

    def op_push_pull(self, w: Waiter, grads: Mapping[str, Any], machine: str | None = None) -> Any:
        """A push, then this worker's next pull, in one request: (params, version, accepted)."""
        self._check(grads)
        m = self._member(w)
        m.machine = machine
        if m.late:
            accepted = self._drop(m)
        elif not self._allowed(m):
            return self._park(w, "push_pull", grads)
        else:
            accepted = self._accept(m, grads)
            self._settle()
        self._wake()
        if self._allowed(m):
            return (*self._pulled(m), accepted)
        return self._park(w, "pull", accepted)

    def _check(self, grads: Mapping[str, Any]) -> None:
        if not isinstance(grads, Mapping):
            raise TypeError(f"push() takes a dict of arrays named as the parameters ({sorted(self.params)}), "
                            f"not {type(grads).__name__}")
        for k, g in grads.items():
            if k not in self.params:
                raise KeyError(f"push(): no parameter named {k!r}; the parameters are {sorted(self.params)}")
            if np.shape(g) != self.params[k].shape:
                raise ValueError(f"push(): the gradient of {k!r} has shape {np.shape(g)}, the parameter "
                                 f"{self.params[k].shape}: give one of the parameter's shape")

    def _drop(self, m: Member) -> bool:
        m.late = False
        self.stats["dropped_late"] += 1
        self.history.append(("drop", m.name, m.clock, self.now()))
        log.warning("parameter server: dropped a late gradient from %s (its round had gone on without it)", m.name)
        return False

    def _accept(self, m: Member, grads: Mapping[str, Any]) -> bool:
        g = {k: np.asarray(v) for k, v in grads.items()}
        self.stats["pushed"] += 1
        m.pushes += 1
        self.history.append(("push", m.name, m.clock, self.version, self.now()))
        if self.staleness == 0:
            self.grads[m.caller] = g
            self.ahead += 1
        else:
            self._update([g])
        self._set_clock(m, m.clock + 1)
        return True

    def _update(self, gradients: list[Params]) -> None:
        self.params = dict(self.apply(self.params, self.aggregate(gradients)))
        self.version += 1
        self.stats["applied"] += len(gradients)
        self.history.append(("version", self.version, len(gradients), self.now()))

    # -- observers ---------------------------------------------------------------------------------
    def op_params(self, w: Waiter, newer_than: int | None = None) -> Any:
        """(params, version), once the version is above ``newer_than``; not a member."""
        if newer_than is not None and self.version <= newer_than:
            w.state = self
            self.watchers.append((w, newer_than))
            return PARKED
        return self.params, self.version

    def op_stats(self, w: Waiter) -> dict[str, Any]:
        return {**self.stats, "version": self.version, "round": self.floor(), "members": len(self.members),
                "staleness": self.staleness}

    def op_history(self, w: Waiter) -> list[tuple[Any, ...]]:
        return list(self.history)

    def op_members(self, w: Waiter) -> dict[str, int]:
        return {m.name: m.clock for m in self.members.values()}

    # -- waiting -------------------------------------------------------------------------------------
    def _park(self, w: Waiter, op: str, arg: Any) -> Any:
        w.state = self
        since = self.now()
        self.waiting.append((w, op, arg, since))
        if self.time_limit is not None and self.staleness > 0 and self.call_later is not None:
            self.call_later(self.time_limit, lambda: self._waited_too_long(w))
        return PARKED

    def _settle(self) -> None:
        """After a push or a member leaving: close the BSP rounds whose gradients are all in
        (else: note how far the floor came)."""
        if self.staleness == 0:
            while self.grads and self.ahead == len(self.members):
                self._close_round(late=[])
        else:
            self.round = max(self.round, self.floor())

    def _close_round(self, late: list[Member]) -> None:
        gradients = list(self.grads.values())
        self.grads.clear()
        for m in late:
            self._set_clock(m, self.round + 1)
            m.late = True
            self.stats["late"] += 1
            self.history.append(("late", m.name, self.round, self.now()))
        if late:
            self.stats["rounds_timed_out"] += 1
            log.warning("parameter server: round %d closed after %.3g s (time_limit) without the gradients of %s; "
                        "theirs will be dropped when they come", self.round, self.now() - self.opened,
                        ", ".join(m.name for m in late))
        if gradients:
            self._update(gradients)
        self.history.append(("round", self.round, len(gradients), [m.name for m in late], self.now()))
        self.round += 1
        self.ahead = 0  # every member is at the new round now
        self._arm_round()

    def _arm_round(self) -> None:
        self.opened = self.now()
        if self.staleness == 0 and self.time_limit is not None and self.call_later is not None:
            opened_round = self.round
            self.call_later(self.time_limit, lambda: self._round_deadline(opened_round))

    def _round_deadline(self, r: int) -> None:
        """``time_limit`` after round ``r`` opened: close it without the members not in yet."""
        if self.round != r:
            return
        if not self.grads:  # nobody pushed yet: nothing to publish; look again later
            self._arm_round()
            return
        self._close_round(late=[m for m in self.members.values() if m.clock == r])
        self._wake()

    def _waited_too_long(self, w: Waiter) -> None:
        """A worker waited ``time_limit`` for slower ones: they are moved up, and late."""
        if w.done or not any(x[0] is w for x in self.waiting):
            return
        m = self.members.get(w.caller)
        if m is None:
            return
        need = m.clock - self.staleness
        for slow in self.members.values():
            if slow.clock < need:
                self._set_clock(slow, need)
                slow.late = True
                self.stats["late"] += 1
                self.history.append(("late", slow.name, need - 1, self.now()))
                log.warning("parameter server: %s kept %s waiting %.3g s (time_limit); it goes on without "
                            "its gradient", slow.name, m.name, self.time_limit)
        self._settle()
        self._wake()

    def _wake(self) -> None:
        """Answer the parked calls that may go on now, in the order they came. A pull changes
        no clock; an accepted push may, so the pass starts again after one (floor recomputed)."""
        again = True
        while again:
            again = False
            floor = self.floor()
            pending, self.waiting = self.waiting, []
            keep: list[tuple[Waiter, str, Any, float]] = []
            for entry in pending:
                w, op, arg, _since = entry
                m = self.members.get(w.caller)
                if again:
                    keep.append(entry)
                elif w.done or m is None:
                    continue
                elif op == "push" and m.late:
                    w.finish(RETURN, self._drop(m))
                elif op == "push_pull" and m.late:  # dropped; its pull waits its turn
                    keep.append((w, "pull", self._drop(m), entry[3]))
                    again = True
                elif not self._allowed(m, floor):
                    keep.append(entry)
                elif op == "pull":
                    w.finish(RETURN, self._pulled(m) if arg is None else (*self._pulled(m), arg))
                elif op == "push_pull":
                    keep.append((w, "pull", self._accept(m, arg), entry[3]))
                    self._settle()
                    again = True
                else:
                    w.finish(RETURN, self._accept(m, arg))
                    self._settle()
                    again = True
            self.waiting = keep + self.waiting
        if self.watchers:
            still: list[tuple[Waiter, int]] = []
            for watcher, newer_than in self.watchers:
                if self.version > newer_than:
                    watcher.finish(RETURN, (self.params, self.version))
                else:
                    still.append((watcher, newer_than))
            self.watchers = still

    def cancel(self, w: Waiter) -> None:
        before = len(self.waiting) + len(self.watchers)
        self.waiting = [x for x in self.waiting if x[0] is not w]
        self.watchers = [x for x in self.watchers if x[0] is not w]
        if len(self.waiting) + len(self.watchers) < before:
            w.finish(ERROR, TimeoutError("the parameter server did not answer within the timeout"))


__all__ = ["Member", "ParamState", "mean", "sgd"]
