"""``fibercore.wait``/``as_completed``, ``AsyncResult.cancel()`` and ``fibercore.Executor``,
on real worker jobs of the local backend."""

from __future__ import annotations

import concurrent.futures
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fibercore as mp
from fibercore.managers import AsyncManager
from tests import futures_tasks as T
from tests import manager_tasks as MT
from tests.helpers import eventually


class EnvManager(AsyncManager):
    pass


EnvManager.register("Env", MT.Env)


@pytest.fixture(scope="module")
def pool():
    with mp.Pool(2) as p:
        p.map(T.square, range(4))  # both workers up
        yield p


@pytest.fixture(scope="module")
def sleepers():
    """Three workers that take one task at a time (their tasks are long: no prefetching), so
    that three tasks run at once."""
    with mp.Pool(3) as p:
        p.starmap(T.sleep_then, [(i, 0.1) for i in range(6)], chunksize=1)
        yield p


# -- wait and as_completed -----------------------------------------------------------------


def test_wait_returns_the_first_ready_in_input_order(sleepers):
    results = [sleepers.apply_async(T.sleep_then, (i, s)) for i, s in enumerate([3.0, 0.1, 3.0])]
    started = time.monotonic()
    ready, not_ready = mp.wait(results, num_returns=1)
    assert time.monotonic() - started < 2.5
    assert ready == [results[1]] and not_ready == [results[0], results[2]]
    ready, not_ready = mp.wait(results, num_returns=3, timeout=0.2)  # a timeout: what is ready
    assert ready == [results[1]] and len(not_ready) == 2
    ready, not_ready = mp.wait(results, num_returns=3)
    assert ready == results and not_ready == [] and [r.get() for r in ready] == [0, 1, 2]


def test_wait_refuses_bad_arguments(pool):
    r = pool.apply_async(T.square, (2,))
    with pytest.raises(ValueError, match="distinct"):
        mp.wait([r, r])
    with pytest.raises(ValueError, match="num_returns"):
        mp.wait([r], num_returns=2)
    with pytest.raises(TypeError, match="AsyncResult"):
        mp.wait([object()])  # type: ignore[list-item]
    assert r.get(10) == 4


def test_as_completed_yields_in_completion_order_and_times_out(sleepers):
    results = [sleepers.apply_async(T.sleep_then, (i, s)) for i, s in enumerate([1.2, 0.1, 0.6])]
    assert [r.get() for r in mp.as_completed(results)] == [1, 2, 0]
    slow = sleepers.apply_async(T.sleep_then, ("slow", 2.0))
    fast = sleepers.apply_async(T.sleep_then, ("fast", 0.05))
    got = []
    with pytest.raises(mp.TimeoutError, match="1 of 2 results were not ready"):
        for r in mp.as_completed([slow, fast], timeout=1.0):
            got.append(r.get())
    assert got == ["fast"] and slow.get(10) == "slow"


def test_wait_mixes_pool_results_manager_calls_and_futures(pool):
    """A manager's answers are read by whoever waits: wait() must read for them too."""
    with EnvManager() as manager, mp.Executor(1) as ex:
        env = manager.Env(7)
        call = env.step(1)  # 0.2 s on the server
        task = pool.apply_async(T.sleep_then, ("pool", 1.5))
        future = ex.submit(T.sleep_then, "executor", 3.0)
        ready, not_ready = mp.wait([future, task, call], num_returns=1, timeout=10)
        assert ready == [call] and call.get() == (7, 1, 1)
        done = list(mp.as_completed([future, task], timeout=30))
        assert done == [task, future] and future.result() == "executor"


def test_wait_costs_no_cpu_while_it_sleeps(pool):
    result = pool.apply_async(T.sleep_then, (1, 1.5))
    before = time.process_time()
    mp.wait([result])
    assert time.process_time() - before < 0.15


# -- cancel --------------------------------------------------------------------------------


def test_a_cancelled_queued_task_never_runs(tmp_path):
    with mp.Pool(1) as one:
        assert one.apply(T.sleep_then, (0, 0.3)) == 0  # a long task: the worker takes one at a time now
        busy = one.apply_async(T.sleep_then, (1, 1.5))
        marker = tmp_path / "ran"
        queued = one.apply_async(T.mark_then_sleep, (str(marker), 0))
        with one._core.lock:
            assert not any(c.batch.sink is queued for w in one._core.fleet.slots() for c in w.pending.values())
        assert queued.cancel() and queued.cancelled() and queued.ready()
        with pytest.raises(mp.CancelledError) as info:
            queued.get(1)
        assert isinstance(info.value, concurrent.futures.CancelledError)
        assert busy.get(10) == 1
        assert one.apply(T.square, (5,)) == 25
        assert not marker.exists()
        assert not queued.cancel()  # once is enough


def test_cancelling_a_running_task_replaces_its_worker_and_the_pool_keeps_serving(pool, tmp_path):
    marker = tmp_path / "running"
    running = pool.apply_async(T.mark_then_sleep, (str(marker), 60))
    eventually(marker.exists)
    victim = int(marker.read_text())
    replaced = pool.stats["replaced_workers"]
    started = time.monotonic()
    assert running.cancel()
    with pytest.raises(mp.CancelledError):
        running.get(5)
    assert time.monotonic() - started < 2
    assert pool.map(T.square, range(20)) == [x * x for x in range(20)]
    eventually(lambda: pool._core.ready_count() == 2 and victim not in [w.pid for w in pool.workers()], 30)
    assert pool.stats["replaced_workers"] == replaced  # a cancel is not a worker's failure


def test_cancel_after_completion_is_false_and_keeps_the_value(pool):
    r = pool.apply_async(T.square, (6,))
    assert r.get(10) == 36
    assert not r.cancel() and not r.cancelled() and r.get() == 36


def test_cancelling_a_map_cancels_what_is_left(pool):
    m = pool.starmap_async(T.sleep_then, [(i, 0.5) for i in range(2)] + [(i, 0.0) for i in range(40)], chunksize=1)
    time.sleep(0.1)
    assert m.cancel()
    with pytest.raises(mp.CancelledError):
        m.get(10)
    assert pool.apply(T.square, (4,)) == 16


# -- Executor ------------------------------------------------------------------------------


def test_executor_runs_raises_and_maps():
    with mp.Executor(2) as ex:
        assert isinstance(ex, concurrent.futures.Executor)
        futures = [ex.submit(T.square, i) for i in range(10)]
        done, not_done = concurrent.futures.wait(futures, timeout=60)
        assert not not_done and [f.result() for f in futures] == [i * i for i in range(10)]
        failing = ex.submit(T.fail, "boom")
        with pytest.raises(ValueError, match="boom"):
            failing.result(30)
        assert list(ex.map(T.square, range(5))) == [0, 1, 4, 9, 16]
        seen = [f.result() for f in concurrent.futures.as_completed([ex.submit(T.sleep_then, i, 0.3 - i / 10)
                                                                     for i in range(3)])]
        assert sorted(seen) == [0, 1, 2]
    with pytest.raises(RuntimeError, match="after shutdown"):
        ex.submit(T.square, 1)


def test_executor_cancels_running_futures_and_reruns_a_dead_workers_task(tmp_path):
    with mp.Executor(2, max_task_retries=1) as ex:
        marker = tmp_path / "running"
        running = ex.submit(T.mark_then_sleep, str(marker), 60)
        eventually(marker.exists)
        calls = []
        running.add_done_callback(calls.append)
        assert running.cancel() and running.cancelled() and calls == [running]
        with pytest.raises(concurrent.futures.CancelledError):
            running.result(1)
        again = ex.submit(T.die_once, str(tmp_path / "died"), 42)  # its worker is SIGKILLed once
        assert again.result(60) == 42
        finished = ex.submit(T.square, 3)
        assert finished.result(30) == 9 and not finished.cancel()


def test_shutdown_cancel_futures_cancels_only_queued_ones(tmp_path):
    """As ProcessPoolExecutor's: calls a worker holds already (running, or handed over ahead)
    finish; the rest are cancelled and never run."""
    ex = mp.Executor(1)
    marker = tmp_path / "first"
    first = ex.submit(T.mark_then_sleep, str(marker), 1.0)
    eventually(marker.exists)
    queued = [ex.submit(T.mark_then_sleep, str(tmp_path / f"q{i}"), 0) for i in range(6)]
    ex.shutdown(wait=True, cancel_futures=True)
    assert first.result() > 0 and not first.cancelled()
    assert queued[-1].cancelled()
    for i, q in enumerate(queued):
        assert q.cancelled() != (tmp_path / f"q{i}").exists()
        if not q.cancelled():
            assert q.result() > 0


def test_executor_per_call_resources_run_on_workers_with_them():
    with mp.Executor(2) as ex:
        plain = ex.submit(T.pid).result(30)
        sized = ex.submit(T.pid, resources={"cpu": 1, "memory": 256}).result(60)
        assert plain != sized  # another pool's worker
        assert ex.submit(T.square, 4, resources={"cpu": 1, "memory": 256}).result(30) == 16
        with pytest.raises(TypeError, match="unknown resources"):
            ex.submit(T.pid, resources={"tpu": 1})


def test_executor_drives_a_pycma_loop():
    """pycma's ask/tell loop with its evaluations on the Executor: the same search as in one
    process (same seed, same values in the same order), and it converges."""
    cma = pytest.importorskip("cma")

    def search(evaluate):
        es = cma.CMAEvolutionStrategy(4 * [1.0], 0.5, {"seed": 3, "verbose": -9, "popsize": 8})
        for _ in range(20):
            xs = es.ask()
            es.tell(xs, evaluate(xs))
        return es.result.fbest

    with mp.Executor(2) as ex:
        remote = search(lambda xs: list(ex.map(T.sphere, xs)))
    assert remote == search(lambda xs: [T.sphere(x) for x in xs])
    assert remote < 0.05 * T.sphere(4 * [1.0])


# -- schedules of submits and cancels -------------------------------------------------------


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.sampled_from([0.0, 0.05, 0.3]), st.booleans()), min_size=1, max_size=8))
def test_random_cancels_lose_nothing_and_queued_cancels_never_run(pool, tmp_path_factory, plan):
    """Each task ends with its value or CancelledError; a task cancelled while queued never
    ran; the pool answers afterwards."""
    d = tmp_path_factory.mktemp("plan")
    results = [pool.apply_async(T.mark_then_sleep, (str(d / f"t{i}"), s)) for i, (s, _) in enumerate(plan)]
    queued_when_cancelled = {}
    for i, (_, cancel) in enumerate(plan):
        if cancel:
            with pool._core.lock:  # what the cancel finds: held by a worker, or queued
                held = any(c.batch.sink is results[i] for w in pool._core.fleet.slots() for c in w.pending.values())
                queued_when_cancelled[i] = not held and not results[i].ready()
                results[i].cancel()
    for i, r in enumerate(results):
        try:
            assert r.get(30) > 0
        except mp.CancelledError:
            assert plan[i][1] and r.cancelled()
            if queued_when_cancelled.get(i):
                assert not (d / f"t{i}").exists()
    assert pool.apply(T.square, (2,)) == 4
