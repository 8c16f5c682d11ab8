"""No task waits behind a running long task while a worker idles (issue: the straggler).

One worker of the pool runs a task that ends only when the test sets an Event, after the
small tasks are done: if any small task were queued behind it, the call would wait for
the Event and time out. Nothing here depends on how fast the machine is.
"""

from __future__ import annotations

import pytest

import fibercore as mp
from tests import pool_tasks as T

#: Seconds a call may take before the test calls it stuck (the long task never ends by itself
#: within it; the small tasks take milliseconds).
STUCK = 60


@pytest.fixture(params=[2, 4, 8], ids=lambda n: f"pool{n}")
def pool(request):
    """Pools of 2 (processes <= cores here) and 4 and 8 (more processes than cores)."""
    with mp.Pool(request.param) as p:
        yield p
        p.terminate()


def _warm(pool) -> None:
    """Many tiny tasks first: the pool measures them and packs small chunks onto busy workers."""
    assert pool.map(T.square, range(2000)) == [x * x for x in range(2000)]


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "packing"])
@pytest.mark.parametrize("chunksize", [None, 1])
def test_map_and_imap_do_not_wait_behind_a_long_task(pool, warm, chunksize):
    if warm:
        _warm(pool)
    release = mp.Event()
    long = pool.apply_async(T.wait_for, (release,))
    kw = {} if chunksize is None else {"chunksize": chunksize}
    try:
        assert pool.map_async(T.square, range(100), **kw).get(timeout=STUCK) == [x * x for x in range(100)]
        it = pool.imap(T.square, range(10), **kw)
        assert [it.next(timeout=STUCK) for _ in range(10)] == [x * x for x in range(10)]
        assert sorted(pool.imap_unordered(T.square, range(50), **kw)) == sorted(x * x for x in range(50))
        assert not long.ready()  # all of it while the long task still ran
    finally:
        release.set()
    assert long.get(timeout=STUCK) is True


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "packing"])
def test_apply_async_does_not_wait_behind_a_long_task(pool, warm):
    if warm:
        _warm(pool)
    release = mp.Event()
    long = pool.apply_async(T.wait_for, (release,))
    try:
        small = [pool.apply_async(T.square, (i,)) for i in range(40)]
        assert [r.get(timeout=STUCK) for r in small] == [i * i for i in range(40)]
        assert not long.ready()
    finally:
        release.set()
    assert long.get(timeout=STUCK) is True


def test_the_multiprocessing_docs_pool_example():
    """The Pool example of the multiprocessing documentation, as written there (with the
    sleeping task last, and an imap after it)."""
    import os
    import time

    with mp.Pool(processes=4) as pool:
        result = pool.apply_async(T.square, (10,))
        assert result.get(timeout=STUCK) == 100
        assert pool.map(T.square, range(10)) == [x * x for x in range(10)]
        it = pool.imap(T.square, range(10))
        assert next(it) == 0
        assert next(it) == 1
        assert it.next(timeout=STUCK) == 4
        result = pool.apply_async(time.sleep, (10,))
        with pytest.raises(mp.TimeoutError):
            result.get(timeout=1)
        # "For the moment, the pool remains available for more work"
        it = pool.imap(T.square, range(10))
        assert it.next(timeout=5) == 0
        assert pool.apply_async(os.getpid).get(timeout=5) > 0
        pool.terminate()
