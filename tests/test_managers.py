"""Managers and proxies: multiprocessing semantics, servers as jobs, proxies across jobs."""

from __future__ import annotations

import multiprocessing
import multiprocessing.managers
import os
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fibercore as mp
from fibercore.errors import ProcessError
from fibercore.managers import AsyncManager, BaseManager, SyncManager
from tests import manager_tasks as T


class CounterManager(BaseManager):
    pass


CounterManager.register("Counter", T.Counter)
CounterManager.register("LimitedCounter", T.Counter, exposed=("increment",))


class EnvManager(AsyncManager):
    pass


EnvManager.register("Env", T.Env)
EnvManager.register("Counter", T.Counter)


@pytest.fixture(scope="module")
def manager():
    with SyncManager() as m:
        yield m


def test_server_is_a_job_and_containers_work(manager):
    assert manager._process.job is not None and manager._process.is_alive()
    assert "://127.0.0.1:" in manager.address  # tcp://, or nng+tcp:// on fiber-nng
    d = manager.dict({"a": 1})
    d["b"] = 2
    assert d.copy() == {"a": 1, "b": 2} and len(d) == 2 and "a" in d and d.get("zz", 0) == 0
    assert sorted(d.keys()) == ["a", "b"] and d.pop("a") == 1
    lst = manager.list([3, 1, 2])
    lst.append(4)
    lst.sort()
    lst += [5]
    assert lst[:] == [1, 2, 3, 4, 5] and lst[0] == 1 and len(lst) == 5 and 4 in lst
    ns = manager.Namespace(x=1)
    ns.y = 2
    assert (ns.x, ns.y) == (1, 2)
    del ns.x
    with pytest.raises(AttributeError):
        _ = ns.x
    v = manager.Value("i", 7)
    v.value += 1
    assert v.value == 8 and v.get() == 8
    a = manager.Array("d", [1.0, 2.0])
    a[0] = 5.0
    assert (len(a), a[0], a[1]) == (2, 5.0, 2.0)
    q = manager.Queue()
    q.put("item")
    assert q.get(timeout=5) == "item" and q.empty()
    jq = manager.JoinableQueue()
    jq.put(1)
    jq.get()
    jq.task_done()
    jq.join()


def test_proxies_travel_to_other_jobs(manager):
    d, lst, ns, q = manager.dict(), manager.list(), manager.Namespace(), manager.Queue()
    p = mp.Process(target=T.use_shared, args=(d, lst, ns, q))
    p.start()
    assert q.get(timeout=60) == "child done"
    p.join(30)
    assert p.exitcode == 0
    assert d["child"] == p.pid and lst[:] == ["from child"] and ns.answer == 42


def test_remote_manager_connected_from_another_job(manager):
    out = mp.Queue()
    p = mp.Process(target=T.use_remote_manager, args=(manager.address, out))
    p.start()
    d = out.get(timeout=60)
    p.join(30)
    assert d.copy() == {"made remotely": True}
    d["back in master"] = 1
    assert len(d) == 2


def test_custom_types_exposed_and_remote_exceptions():
    with CounterManager() as m:
        c = m.Counter(10)
        assert c.increment() == 11 and c.increment(by=5) == 16 and c.get() == 16
        assert c.pid() == m._process.pid  # the object lives in the server's job
        with pytest.raises(KeyError, match="missing thing") as info:
            c.fail("missing thing")
        assert "fail" in str(info.value.__cause__)  # the remote traceback
        limited = m.LimitedCounter()
        assert limited.increment() == 1
        assert not hasattr(limited, "get")
        with pytest.raises(multiprocessing.managers.RemoteError, match="not in the list of allowed methods"):
            limited._callmethod("get")


def test_manager_errors_say_what_to_do():
    with pytest.raises(ValueError, match="address"):
        SyncManager().connect()
    with SyncManager() as m2:
        d = m2.dict()
    with pytest.raises(ProcessError, match="shut down|gone"):
        d["x"] = 1


dict_ops = st.lists(st.one_of(
    st.tuples(st.just("set"), st.integers(0, 5), st.integers()),
    st.tuples(st.just("pop"), st.integers(0, 5), st.none()),
    st.tuples(st.just("setdefault"), st.integers(0, 5), st.integers()),
    st.tuples(st.just("update"), st.integers(0, 5), st.integers()),
    st.tuples(st.just("clear"), st.none(), st.none()),
), max_size=25)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=dict_ops)
def test_dict_proxy_matches_a_local_dict(manager, ops):
    local, remote = {}, manager.dict()
    for op, key, value in ops:
        results = []
        for target in (local, remote):
            try:
                if op == "set":
                    target[key] = value
                    results.append(None)
                elif op == "pop":
                    results.append(target.pop(key))
                elif op == "setdefault":
                    results.append(target.setdefault(key, value))
                elif op == "update":
                    results.append(target.update({key: value}))
                else:
                    results.append(target.clear())
            except KeyError as exc:
                results.append(("KeyError", type(exc).__name__))
        assert results[0] == results[1]
    assert remote.copy() == local and len(remote) == len(local)


list_ops = st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers()),
    st.tuples(st.just("insert"), st.integers(-3, 3), st.integers()),
    st.tuples(st.just("pop"), st.integers(-3, 3)),
    st.tuples(st.just("extend"), st.lists(st.integers(), max_size=3)),
    st.tuples(st.just("reverse"),),
    st.tuples(st.just("sort"),),
    st.tuples(st.just("setitem"), st.integers(-3, 3), st.integers()),
), max_size=25)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=list_ops)
def test_list_proxy_matches_a_local_list(manager, ops):
    local, remote = [], manager.list()
    for op, *args in ops:
        results = []
        for target in (local, remote):
            try:
                if op == "setitem":
                    target[args[0]] = args[1]
                    results.append(None)
                else:
                    results.append(getattr(target, op)(*args))
            except IndexError as exc:
                results.append(("IndexError", type(exc).__name__))
        assert results[0] == results[1]
    assert remote[:] == local and len(remote) == len(local)


def test_async_manager_steps_16_environments_in_parallel():
    with EnvManager() as m:
        envs = [m.Env(seed) for seed in range(16)]
        assert [e.reset().get(30) for e in envs] == list(range(16))
        t0 = time.monotonic()
        handles = [e.step(seed * 10) for seed, e in enumerate(envs)]
        assert all(not h.ready() for h in handles[:4])
        results = [h.get(30) for h in reversed(handles)]  # collected out of order
        elapsed = time.monotonic() - t0
        assert results == [(seed, 1, seed * 10) for seed in reversed(range(16))]
        assert elapsed < 16 * 0.2 / 2  # in parallel, not one after another
        # calls on one object run in order; each handle gets its own call's result
        env = envs[0]
        hs = [env.step(i) for i in range(3)]
        assert [h.get(30) for h in reversed(hs)] == [(0, 4, 2), (0, 3, 1), (0, 2, 0)]
        bad = envs[3].explode()
        with pytest.raises(ValueError, match="env 3 exploded"):
            bad.get(30)
        assert bad.ready() and not bad.successful()


def test_manager_function_like_multiprocessing():
    m = mp.Manager()
    try:
        assert isinstance(m, SyncManager)
        d = m.dict(x=1)
        assert d.copy() == {"x": 1}
    finally:
        m.shutdown()
    assert issubclass(ProcessError, multiprocessing.ProcessError)


def test_the_blogs_remote_env_example_runs_as_written():
    import pathlib
    import runpy

    path = pathlib.Path(__file__).resolve().parent.parent / "examples" / "remote_envs.py"
    example = runpy.run_path(str(path))  # not as __main__: call its train() with fewer steps
    out = example["train"](steps=5, num_envs=4)
    assert out["steps"] == 20 and out["reward"] == 20.0


def test_authkey_of_its_own_and_a_wrong_key_is_refused():
    key = b"a manager key of its own 123456"
    with SyncManager(authkey=key) as m:
        assert m.authkey == key
        d = m.dict(x=1)
        other = SyncManager(address=m.address, authkey=key)
        other.connect()
        assert other.dict(y=2).copy() == {"y": 2}
        assert d.copy() == {"x": 1}
        intruder = SyncManager(address=m.address)  # the session secret, not the manager's key
        with pytest.raises(mp.AuthenticationError, match="another authkey"):
            intruder.connect(timeout=2)


def test_a_blocking_call_holds_up_no_other_thread_of_the_process(manager):
    """As with multiprocessing: one thread blocks in ``q.get()`` on a shared queue while
    another thread of the same process puts the item it waits for (and reads a dict)."""
    import threading

    q = manager.Queue()
    d = manager.dict()
    got: list = []
    getter = threading.Thread(target=lambda: got.append(q.get(timeout=20)))
    getter.start()
    time.sleep(0.3)  # the get is waiting on the server
    t0 = time.monotonic()
    d["x"] = 1
    q.put("item")
    assert d["x"] == 1
    assert time.monotonic() - t0 < 5, "the other thread's calls waited behind the blocking get"
    getter.join(20)
    assert got == ["item"]


def test_thousands_of_calls_in_flight_all_answered_in_order():
    """3,200 AsyncManager calls in flight on 16 objects, three times: every one answered, in
    order per object, and no frame refused (the server's threads take frames in turn, so
    none falls out of the replay window while another thread opens later ones)."""
    from fibercore.wire import stats

    with EnvManager() as m:
        counters = [m.Counter() for _ in range(16)]
        before = stats["rejected_frames"]
        for round_ in range(3):
            handles = [c.increment() for _ in range(200) for c in counters]
            values = [h.get(60) for h in handles]
            assert values == [round_ * 200 + i // 16 + 1 for i in range(3200)]
        assert stats["rejected_frames"] == before


def test_shutdown_and_exit_are_quick_and_the_server_is_gone_when_they_return():
    """As multiprocessing's: milliseconds, and no manager job left in active_children()
    (other tests' module-scoped managers may be running: only this test's are looked for)."""
    import gc

    before = set(mp.active_children())

    def mine() -> set[object]:
        return set(mp.active_children()) - before

    def bound(m: object) -> float:
        """What "quick" means on this machine now: 0.1 s, or 20 round trips to the manager just
        measured, whichever is longer (a busy machine slows both alike; waiting for a timer
        of a second or more is what this catches)."""
        d = m.dict()  # type: ignore[attr-defined]
        trips = []
        for _ in range(5):
            t0 = time.perf_counter()
            d["a"] = 1
            trips.append(time.perf_counter() - t0)
        return max(0.1, 20 * sorted(trips)[2])

    for _ in range(3):
        m = mp.Manager()
        limit = bound(m)
        start = time.perf_counter()
        m.shutdown()
        assert time.perf_counter() - start <= limit
        assert mine() == set()
    for _ in range(3):
        with mp.Manager() as m:
            limit = bound(m)
            start = time.perf_counter()
        assert time.perf_counter() - start <= limit
        assert mine() == set()
    m = mp.Manager()
    m.dict()
    assert len(mine()) == 1
    del m
    gc.collect()
    assert mine() == set()  # a dropped manager is stopped by then


def test_a_manager_whose_server_is_declared_lost_raises_at_once():
    """Its server's job declared lost (silent past heartbeat_timeout; frozen here with
    SIGSTOP, by hand): a call raises ProcessError at once instead of waiting on TCP."""
    import signal
    import socket

    from fibercore import liveness

    manager = mp.Manager()
    try:
        d = manager.dict()
        d["a"] = 1
        os.kill(manager._process.pid, signal.SIGSTOP)
        liveness.declare_lost(socket.gethostname(), manager._process.pid)
        with pytest.raises(mp.ProcessError, match="declared lost"):
            d["b"] = 2
    finally:
        manager._process.kill()
        manager._process.join(30)
