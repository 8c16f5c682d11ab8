"""The original fiber's own tests (uber/fiber 0.2.1, tests/test_config.py, test_misc.py and
test_pool.py), run with only the import changed, and what a fiber program does beyond them:
a Pipe end passed on to a multiprocessing child of a job."""

from __future__ import annotations

import glob
import logging
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

import fibercore as fiber
import fibercore.config
import fibercore.config as fiber_config
from tests import pool_tasks as T


def config_worker(writer):
    cfg = fibercore.config.get_dict()
    writer.send(cfg)
    time.sleep(0.1)


def dummy_q_worker(q):
    logging.getLogger("fibercore.test").debug("the worker ran")
    q.put("DUMMY_WORKER_DONE")
    time.sleep(0.1)


# -- tests/test_config.py ------------------------------------------------------------------
def test_config_file(tmp_path):
    (tmp_path / "demo_config").write_text(
        "[default]\nimage=demo-image:latest\nlog_level=INFO\nipc_active=False\nmem_per_job=12345\n")
    with pytest.warns(UserWarning, match="ipc_active"):  # accepted, and it has no effect here
        config = fiber.config.Config(conf_file=str(tmp_path / "demo_config"))
    assert config.image == "demo-image:latest"
    assert config.log_level == logging.INFO
    assert config.ipc_active is False
    assert config.ipc_admin_master_port == 0
    assert config.ipc_admin_worker_port == 8000
    assert config.mem_per_job == 12345


def test_invalid_key(tmp_path):
    (tmp_path / "invalid_config").write_text("[default]\nthis_key_does_not_exit=yes\n")
    with pytest.raises(ValueError, match="this_key_does_not_exit"):
        _ = fiber.config.Config(conf_file=str(tmp_path / "invalid_config"))


def test_config_env(fresh_runtime, monkeypatch):
    monkeypatch.setenv("FIBER_IMAGE", "image-from-env:latest")
    fiber.init()
    assert fiber_config.image == "image-from-env:latest"


def test_config_sync():
    # child process should have the same config as parent process
    r, w = fiber.Pipe()
    p = fiber.Process(target=config_worker, args=(w,))
    p.start()
    got = r.recv()
    expected = fiber.config.get_dict()
    p.join()
    assert got == expected


# -- tests/test_misc.py::test_log_file_path (the original ran it on docker only) -----------------
def test_log_file_path(fresh_runtime, tmp_path, monkeypatch):
    # make sure workers and master doesn't write to the same log file
    monkeypatch.chdir(tmp_path)
    fiber.init(log_file="tests/logs/fiber.log", log_level="DEBUG")  # a directory that does not exist
    try:
        q = fiber.SimpleQueue()
        p = fiber.Process(target=dummy_q_worker, args=(q,))
        p.start()
        msg = q.get()
        assert msg == "DUMMY_WORKER_DONE"
        p.join()
        files = sorted(glob.glob("tests/logs/*"))
        assert len(files) == 2, files
        assert files[0] == "tests/logs/fiber.log.MainProcess"
        assert "tests/logs/fiber.log.Process-" in files[1]
        regex = r"\w+:Process-\d+\(\d+\):"
        with open("tests/logs/fiber.log.MainProcess") as f:
            assert re.search(regex, f.read()) is None, "Fiber subprocess log found in master log file"
        with open(files[1]) as f:
            assert re.search(regex + r".*the worker ran", f.read())
    finally:
        fiber.init()
    assert not [h for h in logging.getLogger("fibercore").handlers if getattr(h, "_fiber", None)]


# -- tests/test_pool.py::test_error_handling(_unordered) -----------------------------------------
def test_error_handling():
    pool = fiber.Pool(3, error_handling=True)
    try:
        pool.start_workers()
        pool.wait_until_workers_up()
        res = pool.map(T.random_error_worker, [i for i in range(300)], chunksize=1)
        assert res == [i for i in range(300)]
    finally:
        pool.terminate()
        pool.join()


def test_error_handling_unordered():
    pool = fiber.Pool(3, error_handling=True)
    try:
        res = sorted(pool.imap_unordered(T.random_error_worker, [i for i in range(300)], chunksize=1))
        assert res == [i for i in range(300)]
    finally:
        pool.terminate()
        pool.join()


def test_error_handling_is_bounded_and_off_by_default():
    """A task that always raises fails after max_error_retries reruns (10 by default: the
    original retried forever, and its own tests above fail with 3 about once in 250 runs);
    without the flag it fails at once, as in multiprocessing."""
    with fiber.Pool(2, error_handling=True, max_error_retries=2) as pool:
        with pytest.raises(ValueError, match="boom"):
            pool.apply(T.raise_value_error, ("boom",))
        assert pool._core.stats["rerun_after_error"] == 2
    with fiber.Pool(2, error_handling=True) as pool:
        with pytest.raises(ValueError, match="boom"):
            pool.apply(T.raise_value_error, ("boom",))
        assert pool._core.stats["rerun_after_error"] == 10
    with fiber.Pool(1) as pool:
        with pytest.raises(ValueError, match="boom"):
            pool.apply(T.raise_value_error, ("boom",))
        assert pool._core.stats["rerun_after_error"] == 0


# -- beyond the original's tests -----------------------------------------------------------------
def test_a_pipe_end_passed_on_to_a_multiprocessing_spawn_child_of_a_job(tmp_path):
    (tmp_path / "gcmod.py").write_text(textwrap.dedent('''
        import multiprocessing

        def grandchild(conn):
            conn.send("from the grandchild")

        def child(conn):
            p = multiprocessing.get_context("spawn").Process(target=grandchild, args=(conn,))
            p.start()
            p.join()
            conn.send(("grandchild exit", p.exitcode))
    '''))
    (tmp_path / "app.py").write_text(textwrap.dedent('''
        import fibercore as fiber
        from gcmod import child

        if __name__ == "__main__":
            r, w = fiber.Pipe()
            p = fiber.Process(target=child, args=(w,))
            p.start()
            print(r.recv() if r.poll(60) else "nothing")
            print(r.recv() if r.poll(60) else "nothing")
            p.join()
    '''))
    done = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "FIBER_BACKEND": "local"})
    assert done.stdout.splitlines() == ["from the grandchild", "('grandchild exit', 0)"], done.stderr
