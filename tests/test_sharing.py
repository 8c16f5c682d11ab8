"""Shared read-only objects: one copy per machine in /dev/shm (fibercore.sharing)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fibercore as mp
from fibercore import sharing
from tests import sharing_tasks as T

MB = 1 << 20


def _path(handle: mp.Shared) -> str:
    return os.path.join(sharing.SHM_DIR, handle._name)


@settings(max_examples=40, deadline=None)
@given(st.one_of(
    st.binary(max_size=5000),
    st.lists(st.integers(), max_size=50),
    st.dictionaries(st.text(max_size=5), st.floats(allow_nan=False), max_size=10),
    st.integers(0, 5000).map(lambda n: np.arange(n, dtype=np.float32)),
    st.tuples(st.integers(0, 300).map(lambda n: np.ones((n, 3), dtype=np.int16)), st.text(max_size=20)),
))
def test_any_picklable_object_comes_back_equal_through_its_segment(obj):
    handle = mp.shared(obj)
    got = handle.value
    if isinstance(obj, np.ndarray):
        assert got.dtype == obj.dtype and np.array_equal(got, obj)
    elif isinstance(obj, tuple):
        assert np.array_equal(got[0], obj[0]) and got[1] == obj[1]
    else:
        assert got == obj
    handle.release()


def test_the_segment_is_readable_only_by_its_owner_and_read_only_in_jobs():
    handle = mp.shared(np.arange(1000, dtype=np.float64))
    mode = os.stat(_path(handle)).st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert not handle.value.flags.writeable
    with mp.Pool(1) as pool:
        answer = pool.apply(T.try_to_write, (handle,))
    assert answer.startswith("refused") and "read-only" in answer


def test_a_process_maps_an_object_once_however_often_it_receives_it():
    handle = mp.shared(np.zeros(1000))
    with mp.Pool(1) as pool:
        assert pool.apply(T.one_mapping, (handle, handle)) is True


def test_a_job_receives_it_through_a_queue():
    handle = mp.shared({"weights": np.full(10, 3.0)})
    q = mp.Queue()
    p = mp.Process(target=T.value_of, args=(handle, q))
    p.start()
    got = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0 and got["weights"].tolist() == [3.0] * 10


def test_the_segment_goes_with_the_last_handle_and_a_mapping_stays_readable():
    handle = mp.shared(np.arange(100))
    path = _path(handle)
    mapped = handle.value
    assert os.path.exists(path)
    del handle
    import gc

    gc.collect()
    assert not os.path.exists(path)
    assert mapped.sum() == sum(range(100))  # this process's mapping outlives the file


def test_large_initargs_arrays_are_one_copy_mapped_copy_on_write():
    """The issue's case, at 64 MB: each worker reads the whole table; its own memory
    stays far below a table, and a write stays in the worker that made it."""
    table = np.random.default_rng(0).standard_normal(16 * MB, dtype=np.float32)  # 64 MB
    with mp.Pool(2, initializer=T.keep_table, initargs=(table,)) as pool:
        results = pool.map(T.read_table, range(2), chunksize=1)
        for total, writable, own_kib in results:
            assert total == pytest.approx(float(table.sum(dtype=np.float64)))
            assert writable  # as after fork
            assert own_kib * 1024 < table.nbytes * 3 / 4, f"a worker holds {own_kib} KiB of its own"
        assert pool.map(T.write_table, [7.0] * 2, chunksize=1) == [7.0, 7.0]
    assert table[0] != 7.0  # the master's array is untouched
    with mp.Pool(1, initializer=T.keep_table, initargs=(table,)) as pool:
        assert pool.apply(T.first_element, (0,)) == pytest.approx(float(table[0]))


def test_sharing_initargs_can_be_turned_off(fresh_runtime):
    mp.init(share_arrays_from=0)
    table = np.ones(2 * MB // 8)
    with mp.Pool(1, initializer=T.keep_table, initargs=(table,)) as pool:
        _total, _writable, own_kib = pool.apply(T.read_table, (0,))
    assert own_kib * 1024 > table.nbytes  # its own copy


_KILLED_MASTER = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    import fibercore as mp
    handle = mp.shared(np.ones(1000))
    print(handle._name, flush=True)
    os.killpg(0, signal.SIGKILL)  # the master and Python's resource tracker with it
""")


def test_a_sigkilled_masters_segment_is_removed_by_the_next_program_or_fiber_cleanup():
    for remover in ("next program", "fiber cleanup"):
        proc = subprocess.run([sys.executable, "-c", _KILLED_MASTER], capture_output=True, text=True,
                              start_new_session=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL
        name = proc.stdout.strip()
        path = os.path.join(sharing.SHM_DIR, name)
        assert os.path.exists(path), "the kill left the segment (nothing removed it yet)"
        if remover == "fiber cleanup":
            out = subprocess.run([sys.executable, "-m", "fibercore.cli", "cleanup"], capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert "shared object" in out.stdout
        else:
            assert name in sharing.sweep()
        assert not os.path.exists(path)


def test_the_sweep_leaves_segments_of_running_processes():
    handle = mp.shared(b"still in use")
    assert handle._name not in sharing.sweep()
    assert os.path.exists(_path(handle))


def test_a_segment_that_is_not_ours_is_never_mapped(tmp_path):
    handle = mp.shared(np.arange(10))
    os.chmod(_path(handle), 0o644)  # another user could have written it
    assert sharing._open_checked(handle._name, handle._tag, handle._size) is False
    os.chmod(_path(handle), 0o600)
    assert sharing._open_checked(handle._name, os.urandom(16), handle._size) is None  # a planted one: wrong tag


def _open_as_other_user(path: str) -> dict:
    try:
        with open(path, "rb") as fh:
            return {"read": len(fh.read())}
    except PermissionError as exc:
        return {"refused": str(exc)}


def test_another_local_user_cannot_open_a_segment():
    import shutil

    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating a second local user needs root and useradd")
    from tests.attacker import LocalUser

    handle = mp.shared(np.arange(1000))
    user = LocalUser()
    try:
        got = user.run(_open_as_other_user, _path(handle))
    finally:
        user.remove()
    assert "refused" in got, got


def test_only_the_creator_can_release_it():
    handle = mp.shared(np.arange(3))
    with mp.Pool(1) as pool:
        message = pool.apply(_release_elsewhere, (handle,))
    assert "only the process that created" in message


def _release_elsewhere(handle):
    try:
        handle.release()
    except ValueError as exc:
        return str(exc)
    return "released"


_GLOBAL_TABLE = textwrap.dedent("""
    import os
    import numpy as np
    import fibercore as mp

    table = np.arange(16 << 20, dtype=np.float32)  # 64 MB, read as a global by the task

    def own_kib():
        with open("/proc/self/smaps_rollup") as fh:
            return next(int(l.split()[1]) for l in fh if l.startswith("Anonymous:"))

    def task(i):
        return float(table[i]), own_kib()

    if __name__ == "__main__":
        with mp.Pool(2) as pool:
            got = [pool.apply(task, (i,)) for i in range(6)]
            segments = [n for n in os.listdir("/dev/shm") if n.startswith("fcs-%d-" % os.getpid())]
            table = table + 1  # rebound: travels again
            again = pool.apply(task, (1,))
        print(repr((got, len(segments), again)))
""")


def test_a_large_main_global_read_by_tasks_is_one_shared_copy(tmp_path):
    """Read as a __main__ global, a 64 MB table goes to shared memory once: each apply sends
    a handle, each worker maps it (its own memory stays below the table), and rebinding the
    name sends the new value."""
    script = tmp_path / "es.py"
    script.write_text(_GLOBAL_TABLE)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got, segments, again = eval(out.stdout.strip().splitlines()[-1])
    assert [v for v, _ in got] == [float(i) for i in range(6)]
    assert all(kib * 1024 < 48 * MB for _, kib in got), got  # a copy: 64 MB more than a worker's ~22
    assert segments == 1
    assert again[0] == 2.0


def test_a_copy_left_half_made_by_a_killed_process_is_not_waited_for():
    """A process of this machine that was copying a shared object from another machine died
    (SIGKILL with its resource tracker) and left the copy empty: the next reader does not wait
    COPY_WAIT for it; it finds no process holding it, removes it, and reads its own copy."""
    import time

    from fibercore import sharing, shm

    table = mp.shared(list(range(1000)))
    table._machine = "elsewhere"  # as a reader on another machine sees it
    stale = shm.segment_path(f"{shm.COPY_PREFIX}{table._tag.hex()}")
    os.close(os.open(stale, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))  # created, never sized
    try:
        t0 = time.monotonic()
        assert table.value == list(range(1000))
        assert time.monotonic() - t0 < sharing.COPY_WAIT / 4
        assert not os.path.exists(stale)
    finally:
        if os.path.exists(stale):
            os.unlink(stale)
