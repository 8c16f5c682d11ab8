"""The parameter server's semantics: BSP, bounded staleness, asynchronous; late gradients;
workers joining, leaving and dying. Real worker jobs for the behaviour, and hypothesis
driving random schedules against the rules' state machine directly."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import fibercore as mp
from fibercore.paramserver.rules import ParamState, mean, sgd
from fibercore.sync.states import ERROR, PARKED, RETURN, Waiter
from tests import ps_tasks as T
from tests.helpers import eventually


def run_processes(ps, target, argsets, timeout=120):
    procs = [mp.Process(target=target, args=(ps, *args)) for args in argsets]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    assert [p.exitcode for p in procs] == [0] * len(procs)


# -- BSP ---------------------------------------------------------------------------------------


def test_bsp_every_version_holds_every_gradient_of_its_round():
    ps = mp.ParameterServer({"w": np.zeros(4)}, staleness=0, lr=1.0, workers=3)
    log = mp.Queue()
    run_processes(ps, T.rounds, [(i, 20, 0.0, log) for i in range(3)])
    pulls = [log.get(timeout=10) for _ in range(60)]
    # Round r is pulled at version r, whose parameters are r rounds of the mean of 1, 2, 3.
    assert all(version == r for _wid, r, version, _w0 in pulls)
    assert all(w0 == -2.0 * r for _wid, r, _version, w0 in pulls)
    params, version = ps.params()
    assert version == 20 and np.array_equal(params["w"], np.full(4, -40.0))
    stats = ps.stats()
    assert stats["pushed"] == stats["applied"] == 60 and stats.get("dropped_late", 0) == 0
    eventually(lambda: ps.members() == {})  # each process left as it ended (its connection closed)


def test_push_pull_gives_the_same_rounds_in_one_request_each():
    ps = mp.ParameterServer({"w": np.zeros(4)}, staleness=0, lr=1.0, workers=3)
    log = mp.Queue()
    run_processes(ps, T.rounds_push_pull, [(i, 20, log) for i in range(3)])
    pulls = [log.get(timeout=10) for _ in range(60)]
    assert all(version == r and w0 == -2.0 * r for _wid, r, version, w0 in pulls)
    assert ps.version == 20 and ps.stats()["applied"] == 60


def test_a_pull_that_must_wait_times_out_and_is_withdrawn():
    ps = mp.ParameterServer({"w": np.zeros(2)}, staleness=0, lr=1.0)
    other = mp.Process(target=T.rounds, args=(ps, 1, 0))  # joins nobody: 0 rounds
    other.start()
    other.join(30)
    ps.pull()
    ps.push({"w": np.ones(2)})  # alone: the round closes at once
    assert ps.version == 1
    ps.join()
    # A second member that never pushes keeps the round open: this thread's pull must wait.
    q = mp.Queue()
    member = mp.Process(target=T.pid_then_rounds, args=(ps, q, 5, 1, 30.0))
    member.start()
    pid = q.get(timeout=60)
    deadline = time.monotonic() + 30
    while len(ps.members()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    ps.pull()
    ps.push({"w": np.ones(2)})
    started = time.monotonic()
    with pytest.raises(mp.TimeoutError):
        ps.pull(timeout=0.3)
    assert time.monotonic() - started < 2
    os.kill(pid, signal.SIGKILL)  # the member dies: its round goes on without it
    params, version = ps.pull(timeout=30)
    assert version == 2
    member.join(10)


def test_a_late_gradient_is_dropped_reported_and_the_round_goes_on(caplog):
    ps = mp.ParameterServer({"w": np.zeros(4)}, staleness=0, lr=1.0, time_limit=0.5, workers=3)
    results = mp.Queue()

    started = time.monotonic()
    procs = [mp.Process(target=_report, args=(results, T.straggle, ps, i, 4, 1 if i == 2 else -1, 2.5))
             for i in range(3)]
    with caplog.at_level(logging.WARNING, logger="fibercore.paramserver"):
        for p in procs:
            p.start()
        got = dict(results.get(timeout=120) for _ in procs)
        for p in procs:
            p.join(30)
    assert got[0] == got[1] == [True] * 4
    assert got[2] == [True, False, True, True]  # its round-1 gradient came after the round closed
    stats = ps.stats()
    assert stats["dropped_late"] == 1 and stats["rounds_timed_out"] >= 1
    assert any(e[0] == "late" for e in ps.history()) and any(e[0] == "drop" for e in ps.history())
    assert "time_limit" in caplog.text and "dropped a late gradient" in caplog.text
    assert time.monotonic() - started < 30


def _report(results, fn, ps, wid, *args):
    results.put((wid, fn(ps, wid, *args)))


def test_a_sigkilled_worker_does_not_block_the_next_version():
    ps = mp.ParameterServer({"w": np.zeros(4)}, staleness=0, lr=1.0, workers=3)
    q = mp.Queue()
    procs = [mp.Process(target=T.pid_then_rounds, args=(ps, q, i, 60, 0.02)) for i in range(3)]
    for p in procs:
        p.start()
    pids = [q.get(timeout=60) for _ in procs]
    while ps.version < 5:
        time.sleep(0.02)
    os.kill(pids[0], signal.SIGKILL)
    killed_at, version = time.monotonic(), ps.version
    _, later = ps.params(newer_than=version + 2, timeout=5)  # no time limit: noticed by the connection
    assert later > version + 2 and time.monotonic() - killed_at < 5
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs][1:] == [0, 0]
    assert ps.stats()["members_lost"] == 1


def test_pool_tasks_join_and_leave_through_a_resize_and_a_killed_worker(tmp_path):
    ps = mp.ParameterServer({"w": np.zeros(4)}, staleness=0, lr=1.0)
    with mp.Pool(3, max_task_retries=2) as pool:
        first = pool.starmap(T.task_rounds, [(ps, i, 5) for i in range(3)], chunksize=1)
        assert all(len(seen) == 5 for seen in first)
        pool.resize(2)
        second = pool.starmap(T.task_rounds, [(ps, i, 5) for i in range(2)], chunksize=1)
        assert all(len(seen) == 5 for seen in second)
        # A worker SIGKILLed mid-round: its task runs again on a fresh worker, which joins.
        third = pool.starmap(T.task_rounds_die_once, [(ps, i, 8, str(tmp_path / "died")) for i in range(2)],
                             chunksize=1)
        assert all(len(seen) == 8 for seen in third)
    eventually(lambda: ps.members() == {})
    versions = [e[1] for e in ps.history() if e[0] == "version"]
    assert versions == sorted(versions) and versions[-1] == ps.version


# -- bounded staleness and asynchronous -----------------------------------------------------------


def replay_clock_gaps(history):
    """From the event log: for each pull, the puller's round minus the slowest member's."""
    clocks: dict[str, int] = {}
    gaps = []
    for e in history:
        if e[0] == "join":
            clocks[e[1]] = e[2]
        elif e[0] == "push":
            clocks[e[1]] = e[2] + 1
        elif e[0] == "late":
            clocks[e[1]] = e[2] + 1
        elif e[0] == "leave":
            clocks.pop(e[1], None)
        elif e[0] == "pull":
            gaps.append(e[2] - min(clocks.values()))
    return gaps


def test_bounded_staleness_keeps_every_worker_within_s_rounds_of_the_slowest():
    ps = mp.ParameterServer({"w": np.zeros(4)}, staleness=2, lr=0.1, workers=3)
    run_processes(ps, T.rounds, [(0, 15, 0.0), (1, 15, 0.02), (2, 15, 0.08)])
    gaps = replay_clock_gaps(ps.history())
    assert max(gaps) <= 2
    assert max(gaps) == 2  # the fast ones did run ahead: not BSP
    assert ps.stats()["applied"] == 45 and ps.version == 45


def test_asynchronous_mode_applies_every_gradient_exactly_once():
    n, workers = 10, 3
    ps = mp.ParameterServer({"w": np.zeros(n * workers)}, staleness=-1, lr=1.0)
    run_processes(ps, T.one_hot_pushes, [(i, n, n * workers) for i in range(workers)])
    params, version = ps.params()
    assert np.array_equal(params["w"], np.full(n * workers, -1.0))
    assert version == n * workers and ps.stats()["applied"] == n * workers


def test_bad_input_gets_one_clear_line():
    with pytest.raises(ValueError, match="staleness must be 0"):
        mp.ParameterServer({"w": np.zeros(2)}, staleness=-2)
    with pytest.raises(TypeError, match="dict of named arrays"):
        mp.ParameterServer([np.zeros(2)])  # type: ignore[arg-type]
    ps = mp.ParameterServer({"w": np.zeros(2)})
    with pytest.raises(KeyError, match="no parameter named 'v'"):
        ps.push({"v": np.zeros(2)})
    with pytest.raises(ValueError, match="has shape \\(3,\\), the parameter \\(2,\\)"):
        ps.push({"w": np.zeros(3)})
    params, _ = ps.pull()
    with pytest.raises(ValueError, match="read-only"):
        params["w"][0] = 1.0  # the server's own array, in its own process


# -- random schedules against the rules ----------------------------------------------------------


class Schedules(RuleBasedStateMachine):
    """Workers act in a random order on the state machine itself (fake peers, a fake clock):
    nothing deadlocks, no call is answered twice, and the mode's rule holds at every step."""

    WORKERS = 4

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.timers: list[tuple[float, object]] = []
        self.state: ParamState | None = None
        self.answers: dict[int, list] = defaultdict(list)
        self.waiting: dict[int, tuple[str, Waiter]] = {}  # worker -> its parked call
        self.next_op: dict[int, str] = {}
        self.gone: set[int] = set()
        self.accepted: list[tuple[int, float]] = []  # (round, gradient) of each accepted push
        self.pushed_for: dict[int, int] = {}  # worker -> the round its next push is for

    @rule(staleness=st.sampled_from([0, 1, 2, -1]), limit=st.sampled_from([None, 1.0]))
    @precondition(lambda self: self.state is None)
    def make(self, staleness, limit):
        self.state = ParamState({"w": np.zeros(2)}, staleness, mean, sgd(1.0), limit,
                                call_later=lambda d, fn: self.timers.append((self.now + d, fn)),
                                name_of=lambda peer: f"W{peer}", clock=lambda: self.now)
        self.next_op = {i: "pull" for i in range(self.WORKERS)}

    def _call(self, i: int, op: str, *args):
        w = Waiter((i, 1), lambda kind, value, i=i: self.answers[i].append((op, kind, value)))
        answer = getattr(self.state, "op_" + op)(w, *args)
        if answer is PARKED:
            self.waiting[i] = (op, w)
        else:
            w.finish(RETURN, answer)

    @rule(i=st.integers(0, WORKERS - 1), together=st.booleans())
    @precondition(lambda self: self.state is not None)
    def act(self, i, together):
        if i in self.gone or i in self.waiting:
            return
        op = self.next_op[i]
        if op == "pull":
            self._call(i, "pull")
        else:  # a push alone, or with the next pull in one request
            self._call(i, "push_pull" if together else "push", {"w": np.full(2, float(i + 1))})

    @rule(i=st.integers(0, WORKERS - 1), abrupt=st.booleans())
    @precondition(lambda self: self.state is not None)
    def lose(self, i, abrupt):
        if i in self.gone:
            return
        self.gone.add(i)
        self.waiting.pop(i, None)
        self.state.peer_lost(i, f"W{i}", abrupt)

    @rule(dt=st.sampled_from([0.3, 1.1]))
    @precondition(lambda self: self.state is not None)
    def tick(self, dt):
        self.now += dt
        due = [t for t in self.timers if t[0] <= self.now]
        self.timers = [t for t in self.timers if t[0] > self.now]
        for _, fn in due:
            fn()

    @invariant()
    def answers_follow_the_rules(self):
        s = self.state
        if s is None:
            return
        for i, answers in self.answers.items():
            while answers:
                op, kind, value = answers.pop(0)
                assert kind != ERROR, value
                entry = self.waiting.get(i)
                if entry is not None and entry[1].done:
                    del self.waiting[i]
                self.next_op[i] = "pull" if op == "push" else "push"
                member = s.members.get((i, 1))
                accepted = value if op == "push" else value[2] if op == "push_pull" else None
                if accepted is True:  # in its round (BSP), or applied at once
                    assert member is not None
                    # the round it was for: its clock before the push (push_pull: before its pull too)
                    self.accepted.append((self.pushed_for.pop(i), float(i + 1)))
                if op in ("pull", "push_pull") and member is not None:
                    self.pushed_for[i] = member.clock
                    if s.staleness == 0:
                        assert value[1] == member.clock == s.round  # BSP: the round's own version
        for _i, (_op, w) in self.waiting.items():
            assert not w.done, "answered but not delivered"
        live = [i for i in range(self.WORKERS) if i not in self.gone and (i, 1) in s.members]
        if s.staleness >= 0 and live:
            clocks = [s.members[(i, 1)].clock for i in live]
            assert max(clocks) - min(clocks) <= s.staleness + 1  # a push takes one past the bound at most
            # No deadlock: some live member is not waiting, or may go on.
            assert any(i not in self.waiting for i in live) or any(s._allowed(s.members[(i, 1)]) for i in live)

    @invariant()
    def the_parameters_hold_each_accepted_gradient_once(self):
        """What the server logged as accepted is what the workers were told (but for answers
        still on their way, and workers that left first), and the parameters hold exactly that."""
        s = self.state
        if s is None:
            return
        logged = [(e[2], float(int(e[1].split()[0][1:]) + 1)) for e in s.history if e[0] == "push"]
        told = sorted(self.accepted)
        assert all(told.count(x) <= logged.count(x) for x in told)
        lost = sorted(set(logged) - set(told))
        for _r, g in lost:  # not told yet: its answer waits (a push_pull's pull), or it left
            i = int(g) - 1
            assert i in self.waiting or any(e[0] == "leave" and e[1] == f"W{i} thread 1" for e in s.history)
        if s.staleness == 0:  # the mean of each closed round's gradients
            by_round: dict[int, list[float]] = defaultdict(list)
            for r, g in logged:
                by_round[r].append(g)
            expected = -sum(np.mean(by_round[r]) for r in range(s.round) if by_round[r])
            assert s.version == sum(1 for r in range(s.round) if by_round[r])
            assert s.stats["applied"] == sum(len(by_round[r]) for r in range(s.round))
        else:  # each gradient applied once, as it came
            expected = -sum(g for _r, g in logged)
            assert s.version == s.stats["applied"] == len(logged)
        assert np.allclose(s.params["w"], expected)


TestSchedules = Schedules.TestCase
TestSchedules.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


# -- large parameters: the board --------------------------------------------------------------


def test_large_parameters_reach_workers_on_this_machine_through_the_board():
    big = np.arange(300_000, dtype=np.float32)
    ps = mp.ParameterServer({"w": np.zeros(4), "big": big}, staleness=0, lr=1.0, workers=3, share_from=1 << 20)
    log = mp.Queue()
    run_processes(ps, T.rounds, [(i, 10, 0.0, log) for i in range(3)])
    pulls = [log.get(timeout=10) for _ in range(30)]
    assert all(version == r and w0 == -2.0 * r for _wid, r, version, w0 in pulls)
    assert ps.stats()["board_pulls"] == 30  # every pull of the three jobs: none carried 1.2 MB
    board = ps._local_state().board
    path = f"/dev/shm/{board.name}"
    assert os.stat(path).st_mode & 0o777 == 0o600
    params, version = ps.params()
    assert version == 10 and np.array_equal(params["big"], big)  # no gradient for "big": unchanged


def test_small_parameters_and_share_from_0_keep_to_the_connection():
    small = mp.ParameterServer({"w": np.zeros(4)}, staleness=0, workers=1)  # below share_arrays_from
    big = mp.ParameterServer({"w": np.zeros(4), "big": np.zeros(1 << 20)}, staleness=0, workers=1, share_from=0)
    for ps in (small, big):
        run_processes(ps, T.rounds, [(0, 3, 0.0)])
        assert ps.stats().get("board_pulls", 0) == 0 and ps._local_state().board is None


# -- large parameters to other machines: the relay ---------------------------------------------


def test_each_version_crosses_to_another_machine_once_however_many_workers_there():
    """Six jobs "on" two other machines (each pretends so: its pulls come back as relay
    references); the two share this machine's /dev/shm, so they are one machine to the relay:
    each version of the 1.2 MB parameters is fetched once, and every worker reads the right
    version. (tests on the multi-host cluster count real machines.)"""
    big = np.arange(300_000, dtype=np.float32)
    ps = mp.ParameterServer({"w": np.zeros(4), "big": big}, staleness=0, lr=1.0, workers=6, share_from=1 << 20)
    log = mp.Queue()
    run_processes(ps, T.rounds_elsewhere, [(f"machine{i % 2}", i, 5, log) for i in range(6)])
    pulls = [log.get(timeout=10) for _ in range(30)]
    assert sorted(r for _w, r, _v, _w0 in pulls) == sorted(list(range(5)) * 6)
    assert all(version == r and w0 == -3.5 * r for _wid, r, version, w0 in pulls)  # mean of 1..6 per round
    stats = ps.stats()
    size = sum(a.nbytes for a in ps.params()[0].values())
    assert stats["relay_pulls"] == 30 and stats.get("pulled_bytes", 0) == 0, stats
    assert stats["host_fetches"] == 5, stats  # 5 versions (0-4), once each
    assert stats["relayed_bytes"] == 5 * size, stats
    assert not [n for n in os.listdir("/dev/shm") if n.startswith("fcs-copy-ps-")]  # gone with the jobs


def test_a_relay_slot_that_is_planted_stale_or_not_ours_is_not_read():
    from fibercore.paramserver import relay
    from fibercore.paramserver.board import SLOTS, layout_of

    params = {"a": np.arange(10.0), "b": np.ones((2, 3), dtype=np.int32)}
    layout, slot_size = layout_of(params)
    fetched = []

    def fetch(version):
        fetched.append(version)
        return {k: v + version for k, v in params.items()}

    ref = relay.HostRef(os.urandom(16), 0, layout, slot_size)
    try:
        assert np.array_equal(ref.read(fetch)["a"], params["a"]) and fetched == [0]
        assert np.array_equal(ref.read(fetch)["a"], params["a"]) and fetched == [0]  # from the host board
        later = relay.HostRef(ref.tag, SLOTS, layout, slot_size)  # the same slot, a later version
        assert np.array_equal(later.read(fetch)["a"], params["a"] + SLOTS) and fetched == [0, SLOTS]
        assert np.array_equal(ref.read(fetch)["a"], params["a"]) and fetched == [0, SLOTS, 0]  # overwritten: fetched
    finally:
        relay._boards.pop(ref.name).mm.close()
        os.unlink(f"/dev/shm/{ref.name}")
    # A file under the name that is not this process's board (readable by others): never read.
    other = relay.HostRef(os.urandom(16), 1, layout, slot_size)
    with open(f"/dev/shm/{other.name}", "wb") as f:
        f.write(other.tag + b"\xff" * (other.size - 16))
    os.chmod(f"/dev/shm/{other.name}", 0o644)
    try:
        assert np.array_equal(other.read(fetch)["a"], params["a"] + 1) and fetched[-1] == 1
        assert relay._boards[other.name] is None
    finally:
        os.unlink(f"/dev/shm/{other.name}")


def test_a_board_slot_written_again_or_planted_is_not_read(tmp_path):
    from fibercore.paramserver.board import SLOTS, Board, BoardRef

    params = {"a": np.arange(10.0), "b": np.ones((2, 3), dtype=np.int32)}
    board = Board(params)
    try:
        ref = board.ref(board.publish(0, params), 0)
        got = ref.read()
        assert got is not None and np.array_equal(got["a"], params["a"]) and np.array_equal(got["b"], params["b"])
        newer = {"a": params["a"] + 1, "b": params["b"]}
        board.publish(SLOTS, newer)  # the same slot, a later version: the old reference reads nothing
        assert ref.read() is None
        assert np.array_equal(board.ref(0, SLOTS).read()["a"], newer["a"])
        assert BoardRef(board.name, b"x" * 16, board.size, board.slot_size, 0, SLOTS, board.layout).read() is None
    finally:
        board.close()
    planted = "fcs-planted-ps-test"
    with open(f"/dev/shm/{planted}", "wb") as f:  # readable by others: never used
        f.write(board.tag + b"\0" * (board.size - 16))
    os.chmod(f"/dev/shm/{planted}", 0o644)
    try:
        assert BoardRef(planted, board.tag, board.size, board.slot_size, 0, 0, board.layout).read() is None
    finally:
        os.unlink(f"/dev/shm/{planted}")


# -- a job declared lost ---------------------------------------------------------------------


def test_a_job_declared_lost_leaves_the_rounds_at_once():
    """The admin hub declares a job lost when it is silent past heartbeat_timeout (a host cut
    off; tests on the multi-host cluster do that for real). Here a worker is frozen (SIGSTOP:
    its connections stay open, TCP would wait) and declared lost by hand: the service drops
    its connections at once and the rounds go on without it."""
    import socket

    from fibercore import liveness

    ps = mp.ParameterServer({"w": np.zeros(4)}, staleness=0, lr=1.0, workers=2)
    q = mp.Queue()
    procs = [mp.Process(target=T.pid_then_rounds, args=(ps, q, i, 100_000, 0.01)) for i in range(2)]
    for p in procs:
        p.start()
    try:
        assert {q.get(timeout=60) for _ in procs} == {p.pid for p in procs}
        eventually(lambda: ps.version >= 3, 60)
        os.kill(procs[0].pid, signal.SIGSTOP)
        liveness.declare_lost(socket.gethostname(), procs[0].pid)
        eventually(lambda: ps.stats().get("members_lost") == 1, 30)
        version = ps.version
        eventually(lambda: ps.version >= version + 3, 30)
    finally:
        for p in procs:
            p.kill()
            p.join(30)


def test_stats_has_every_documented_counter_from_the_start():
    """A fresh server's ``stats()`` names every counter the docs promise, each 0, so a
    program reading ``stats()["members_lost"]`` before anything was lost gets 0, not KeyError."""
    ps = mp.ParameterServer({"w": np.zeros(2)}, staleness=0, lr=1.0, workers=1)
    stats = ps.stats()
    for key in ("members_lost", "late", "dropped_late", "rounds_timed_out", "board_pulls", "pushed", "applied"):
        assert stats[key] == 0, key
    assert stats["version"] == 0
