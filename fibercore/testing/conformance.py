"""The backend conformance suite (docs/writing-a-backend.md): one class, bound per backend.

Each test starts real jobs through the public API, so it checks the backend's
hooks as users exercise them: lifecycle, exit codes, terminate and kill, join
timeouts, logs, environment and config propagation, queues and pipes across jobs,
start-up failures with logs, and cleanup. Targets are module-level functions so
that every backend (including container ones) can import them in the worker.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any, ClassVar

import pytest

import fibercore as fc
from fibercore.errors import ConfigError, JobStartError, ProcessError
from fibercore.testing.plugin import stop_children
from fibercore.testing.targets import (
    burn_cpu,
    consume,
    echo_pipe,
    exit_with,
    fill_shared,
    print_marker,
    print_then_sleep,
    produce,
    raise_error,
    report_environment,
    ring_init,
    ring_report,
    sleep_for,
    slow_triple,
    spawn_grandchild,
    sync_party,
    triple,
    triple_after,
)
from fibercore.types import JobStatus

#: The lifecycle tests (exit codes, join, terminate, kill, logs): ``pytest -m fiber_lifecycle``
#: runs only them, the quickest check that a new backend's job hooks are right.
lifecycle = pytest.mark.fiber_lifecycle


class BackendConformance:
    """Subclass with ``backend = "<name>"`` (and ``config``) to run the suite on a backend."""

    backend: ClassVar[str] = "local"
    config: ClassVar[dict[str, Any]] = {}
    #: An interpreter path that exists where jobs run but is not a working Python,
    #: used to check start-up failures (None skips that test).
    broken_python_exe: ClassVar[str | None] = "/bin/false"
    #: Exit code a terminated job reports (None: any non-zero code is accepted).
    terminate_exitcode: ClassVar[int | None] = None
    timeout: ClassVar[float] = 60.0
    #: When ``fiber logs JOB`` (fiber_read_job_logs) can show a job's output: "running" (while
    #: it runs), "after_exit" (once it ended: moto writes Batch logs then), or "master" (only
    #: the master that started it has them: the local backend, which says so).
    logs_from_elsewhere: ClassVar[str] = "running"
    #: Whether a job ends by itself with the master that started it (fiber-ssh: with the ssh
    #: session), so that ``fiber cleanup`` finds nothing of a killed master to remove.
    jobs_end_with_their_master: ClassVar[bool] = False
    #: Whether the backend tells a running job's CPU time and memory (``fiber_job_usage``,
    #: ``EngineBackend.reports_usage``); one that does not must answer None.
    reports_usage: ClassVar[bool] = False

    @pytest.fixture
    def backend_config(self) -> dict[str, Any]:
        """The config every test runs with; override it as a fixture when it needs one
        (an image built once per session, a cluster's address)."""
        return dict(self.config)

    @pytest.fixture(autouse=True)
    def _fiber_backend(self, backend_config: dict[str, Any]) -> Any:
        self.config = backend_config  # type: ignore[misc]
        fc.init(backend=self.backend, **self.config)
        yield
        stop_children()
        fc.init()

    # -- lifecycle ------------------------------------------------------------------------------
    @lifecycle
    def test_exit_code_zero(self) -> None:
        p = fc.Process(target=sleep_for, args=(0,))
        assert p.exitcode is None
        p.start()
        p.join(self.timeout)
        assert p.exitcode == 0
        assert not p.is_alive()
        assert p not in fc.active_children()

    @lifecycle
    def test_exit_code_from_sys_exit(self) -> None:
        p = fc.Process(target=exit_with, args=(3,))
        p.start()
        p.join(self.timeout)
        assert p.exitcode == 3

    @lifecycle
    def test_exception_gives_exit_code_1_and_traceback_in_logs(self) -> None:
        p = fc.Process(target=raise_error, args=("conformance-boom",))
        p.start()
        p.join(self.timeout)
        assert p.exitcode == 1
        deadline = time.monotonic() + 10
        while "conformance-boom" not in p.logs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "RuntimeError: conformance-boom" in p.logs()

    @lifecycle
    def test_join_timeout_and_is_alive(self) -> None:
        p = fc.Process(target=sleep_for, args=(30,))
        p.start()
        assert p.pid is not None
        t0 = time.monotonic()
        p.join(0.3)
        assert time.monotonic() - t0 < 5
        assert p.is_alive() and p.exitcode is None
        assert p in fc.active_children()
        p.kill()
        p.join(self.timeout)
        assert not p.is_alive()

    @lifecycle
    def test_terminate(self) -> None:
        p = fc.Process(target=sleep_for, args=(60,))
        p.start()
        p.terminate()
        p.terminate()  # idempotent
        p.join(self.timeout)
        assert p.exitcode is not None and p.exitcode != 0
        if self.terminate_exitcode is not None:
            assert p.exitcode == self.terminate_exitcode
        p.terminate()  # terminating a finished job is not an error

    @lifecycle
    def test_kill(self) -> None:
        p = fc.Process(target=sleep_for, args=(60,))
        p.start()
        p.kill()
        p.join(self.timeout)
        assert p.exitcode is not None and p.exitcode != 0
        assert p.job_status() in (JobStatus.EXITED, JobStatus.UNKNOWN)

    @lifecycle
    def test_usage_of_a_running_job(self) -> None:
        from fibercore.runtime import get_runtime

        plugins = get_runtime().plugins
        p = fc.Process(target=burn_cpu, args=(60,))
        p.start()
        try:
            if not self.reports_usage:
                assert plugins.job_usage(p.job) is None
                return
            first = None
            deadline = time.monotonic() + self.timeout
            while first is None and time.monotonic() < deadline:  # a cluster may still schedule it
                first = plugins.job_usage(p.job)
                time.sleep(0.2)
            assert first is not None and first.rss_bytes and first.rss_bytes > 1 << 20, first
            time.sleep(1.0)
            later = plugins.job_usage(p.job)
            assert later is not None and later.cpu_seconds is not None and first.cpu_seconds is not None
            assert later.cpu_seconds - first.cpu_seconds > 0.3, (first, later)  # it computes
        finally:
            p.kill()
            p.join(self.timeout)
        assert plugins.job_usage(p.job) is None  # an ended job has no usage

    @lifecycle
    def test_logs(self) -> None:
        marker = f"conformance-marker-{os.getpid()}-{time.time_ns()}"
        p = fc.Process(target=print_marker, args=(marker,))
        p.start()
        p.join(self.timeout)
        assert p.exitcode == 0
        deadline = time.monotonic() + 10
        while marker + "-stderr" not in p.logs() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert marker in p.logs()
        assert marker + "-stderr" in p.logs()

    def test_env_and_config_propagate(self) -> None:
        fc.init(backend=self.backend, start_timeout=97.0, **self.config)
        q = fc.Queue()
        p = fc.Process(target=report_environment, args=(q,), name="conformance-env")
        p.start()
        seen = q.get(timeout=self.timeout)
        p.join(self.timeout)
        rt = fc.get_runtime()
        assert seen["backend"] == self.backend
        assert seen["session"] == rt.session
        assert seen["name"] == "conformance-env"
        assert seen["parent"] == "MainProcess"
        assert seen["start_timeout"] == 97.0
        assert seen["secret_in_env"] is False  # removed from the worker's environment

    def test_nested_process(self) -> None:
        q = fc.Queue()
        p = fc.Process(target=spawn_grandchild, args=(q,))
        p.start()
        inner = q.get(timeout=self.timeout)
        assert q.get(timeout=self.timeout) == 0
        p.join(self.timeout)
        assert p.exitcode == 0
        assert inner["parent"] == p.name

    # -- communication across jobs --------------------------------------------------------------------
    def test_queue_across_jobs(self) -> None:
        q, out = fc.Queue(), fc.Queue()
        producers = [fc.Process(target=produce, args=(q, i * 100, 100)) for i in range(2)]
        consumer = fc.Process(target=consume, args=(q, out, 200))
        for p in [*producers, consumer]:
            p.start()
        got = out.get(timeout=self.timeout)
        for p in [*producers, consumer]:
            p.join(self.timeout)
            assert p.exitcode == 0
        assert got == list(range(200))

    def test_pipe_across_jobs(self) -> None:
        here, there = fc.Pipe()
        p = fc.Process(target=echo_pipe, args=(there,))
        p.start()
        for item in [1, "two", b"three", {"four": [4]}]:
            here.send(item)
            assert here.recv() == item
        here.send(None)
        with pytest.raises(EOFError):
            here.recv()
        p.join(self.timeout)
        assert p.exitcode == 0

    # -- pools -----------------------------------------------------------------------------------
    #: Workers for the pool tests (container and cluster backends may lower it).
    pool_size: ClassVar[int] = 2

    def test_pool_map_apply_imap(self) -> None:
        with fc.Pool(self.pool_size) as pool:
            assert pool.map(triple, range(100)) == [3 * x for x in range(100)]
            assert pool.apply(triple, (7,)) == 21
            assert sorted(pool.imap_unordered(triple, range(20))) == [3 * x for x in range(20)]
            assert all(w.job is not None and w.job.backend == self.backend for w in pool.workers())

    def test_pool_reruns_the_tasks_of_a_killed_job(self) -> None:
        """Kill a worker's job through the backend mid-map: its tasks rerun on a replacement."""
        with fc.Pool(self.pool_size) as pool:
            pool.map(triple, range(self.pool_size * 2))
            result = pool.map_async(slow_triple, range(300), chunksize=2)
            time.sleep(0.5)
            victim = pool.workers()[0]
            victim.kill()  # fiber_terminate_job(force=True): docker kill, pod delete, TerminateJob
            assert result.get(self.timeout * 3) == [3 * x for x in range(300)]
            deadline = time.monotonic() + self.timeout
            while victim in pool.workers() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert victim not in pool.workers()
            assert pool.stats["replaced_workers"] >= 1
            assert pool.apply(triple, (1,)) == 3

    #: Workers of the pool whose job is killed outside fibercore, and the length of each
    #: task of its map: the map must outlast the backend's kill (a cluster that reports a
    #: pod Running late needs longer tasks).
    kill_pool_size: ClassVar[int] = 4
    kill_task_seconds: ClassVar[float] = 0.04

    def kill_outside_fibercore(self, process: fc.Process) -> None:
        """Kill ``process``'s job with the platform's own tools, not through fibercore (a
        ``docker kill``, a pod deletion, a Batch TerminateJob, an OOM killer): the backend
        must notice. Default: SIGKILL to the job's pid (jobs on this machine)."""
        if process.pid is None:
            pytest.skip("the backend has no pid to kill: override kill_outside_fibercore")
        os.kill(process.pid, signal.SIGKILL)

    def check_replaced_outside(self, victim: fc.Process, workers: list[fc.Process]) -> None:
        """The platform's own view after the kill: override to check that it shows the
        victim's job ended and the replacements running (a backend's extra assertions)."""

    def test_pool_survives_a_job_killed_outside_fibercore(self) -> None:
        """A worker's job killed by the platform mid-map: its tasks run again, a replacement
        job starts, the pool is whole and usable, and the platform agrees."""
        size = self.kill_pool_size
        with fc.Pool(size) as pool:
            results = pool.starmap_async(triple_after, [(x, self.kill_task_seconds) for x in range(50 * size)],
                                         chunksize=2)
            assert pool.wait_until_workers_up(self.timeout * 2)  # every worker's job runs and took tasks
            time.sleep(0.3)
            victim = pool.workers()[0]
            self.kill_outside_fibercore(victim)
            assert not results.ready(), "the map finished before the kill: make the tasks slower"
            assert results.get(self.timeout * 4) == [3 * x for x in range(50 * size)]
            assert pool.stats["retried_chunks"] >= 1
            deadline = time.monotonic() + self.timeout * 2
            while (victim in pool.workers() or len(pool.workers()) < size) and time.monotonic() < deadline:
                time.sleep(0.1)
            workers = pool.workers()
            assert victim not in workers and len(workers) == size
            assert pool.stats["replaced_workers"] >= 1
            assert victim.job.jid not in {w.job.jid for w in workers}
            self.check_replaced_outside(victim, workers)
            assert pool.map(abs, range(-10, 0)) == list(range(10, 0, -1))

    # -- managers and rings ----------------------------------------------------------------------
    def test_manager_server_is_a_job_and_proxies_cross_jobs(self) -> None:
        from fibercore.managers import SyncManager

        with SyncManager() as manager:
            assert manager._process.job.backend == self.backend
            d, q = manager.dict(), manager.Queue()  # type: ignore[attr-defined]
            p = fc.Process(target=fill_shared, args=(d, q))
            p.start()
            assert q.get(timeout=self.timeout) == "filled"
            p.join(self.timeout)
            assert p.exitcode == 0 and list(d.keys()) == [p.name]

    def test_ring_members_rendezvous(self) -> None:
        out = fc.Queue()
        ring = fc.Ring(2, ring_report, initializer=ring_init, initargs=(out,))
        ring.run(timeout=self.timeout * 2)
        got = sorted(out.get(timeout=self.timeout) for _ in range(2))
        assert [(r, s) for r, s, _ in got] == [(0, 2), (1, 2)] and got[0][2] == got[1][2]

    # -- synchronization ----------------------------------------------------------------------------
    def test_lock_event_and_barrier_across_jobs(self) -> None:
        """A Lock, an Event, a Barrier and a Value made here, used by two jobs of this backend:
        the jobs wait for the event, count under the lock (exactly), then meet this process
        at the barrier."""
        lock, go, barrier = fc.Lock(), fc.Event(), fc.Barrier(3, timeout=self.timeout * 2)
        counter = fc.Value("i", 0, lock=False)
        jobs = [fc.Process(target=sync_party, args=(lock, go, barrier, counter, 200)) for _ in range(2)]
        for p in jobs:
            p.start()
        assert counter.value == 0 and not go.is_set()
        go.set()
        try:
            assert barrier.wait() in (0, 1, 2)
        except fc.BrokenBarrierError as exc:  # say what happened to the parties (a rare CI failure)
            for p in jobs:
                p.join(10)
            told = "; ".join(f"{p.name}: exit code {p.exitcode}, logs: {p.logs()[-2000:]!r}" for p in jobs)
            raise AssertionError(f"the barrier broke ({exc}); {told}") from exc
        assert counter.value == 400 and not barrier.broken
        for p in jobs:
            p.join(self.timeout)
        assert [p.exitcode for p in jobs] == [0, 0]

    # -- operations: what the fiber command asks a backend ---------------------------------------
    def test_operation_hooks_find_follow_and_check(self) -> None:
        """fiber_list_jobs finds a running job by its session, fiber_read_job_logs shows its
        output, fiber_follow_logs (where implemented) streams it, fiber_doctor says all is well."""
        import threading

        rt = fc.get_runtime()
        plugins = rt.plugins
        unhealthy = [c for c in plugins.doctor() if not c.ok]
        assert unhealthy == [], f"fiber_doctor reports problems with a working backend: {unhealthy}"
        marker = f"operations-marker-{os.getpid()}-{time.time_ns()}"
        after_exit = self.logs_from_elsewhere == "after_exit"
        p = fc.Process(target=print_then_sleep, args=(marker, 3 if after_exit else 60))
        p.start()
        job = p._popen.job
        followed: list[str] = []
        stream = plugins.follow_logs(job)
        if stream is not None:
            threading.Thread(target=lambda: followed.extend(stream), daemon=True).start()
        try:
            try:
                listed = plugins.list_jobs(rt.session)
            except ConfigError:
                pytest.skip("the backend does not implement fiber_list_jobs")
            ours = [info for info in listed if info.jid == job.jid]
            assert len(ours) == 1, f"fiber_list_jobs({rt.session!r}) did not list {job.jid}: {listed}"
            assert ours[0].session == rt.session and ours[0].name.lower() == p.name.lower()
            assert ours[0].status in (JobStatus.PENDING, JobStatus.RUNNING)
            assert all(info.session == rt.session for info in listed)
            if self.logs_from_elsewhere == "master":
                with pytest.raises(Exception, match=r"\w"):
                    plugins.read_job_logs(job.jid)
            elif self.logs_from_elsewhere == "running":
                deadline = time.monotonic() + 30
                while marker not in plugins.read_job_logs(job.jid) and time.monotonic() < deadline:
                    time.sleep(0.5)
                assert marker in plugins.read_job_logs(job.jid)
            if stream is not None and self.logs_from_elsewhere == "running":
                deadline = time.monotonic() + 30
                while marker not in "".join(followed) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert marker in "".join(followed), "fiber_follow_logs did not yield what the job printed"
        finally:
            if not after_exit:
                p.terminate()
            p.join(self.timeout)
        if after_exit:
            deadline = time.monotonic() + 30
            while marker not in plugins.read_job_logs(job.jid) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert marker in plugins.read_job_logs(job.jid)
        if stream is not None:
            deadline = time.monotonic() + 30
            while marker not in "".join(followed) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert marker in "".join(followed), "fiber_follow_logs did not yield what the job printed"
        with pytest.raises(ConfigError, match="no job"):
            plugins.read_job_logs("fiber-no-such-job-0")

    # -- failures and cleanup -----------------------------------------------------------------------
    def test_start_failure_reports_status_and_logs(self) -> None:
        if self.broken_python_exe is None:
            pytest.skip("backend declares no broken interpreter path")
        # The backend's own configuration may name an interpreter (its nodes' python): this one wins.
        fc.init(backend=self.backend, **{**self.config, "python_exe": self.broken_python_exe, "start_timeout": 30})
        p = fc.Process(target=sleep_for, args=(0,))
        with pytest.raises(ProcessError) as info:
            p.start()
        text = str(info.value)
        assert "failed to start" in text or "could not start" in text
        if isinstance(info.value, JobStartError):
            assert "job logs" in text and info.value.status is not None

    def test_no_job_left_after_join(self) -> None:
        procs = [fc.Process(target=sleep_for, args=(0.1,)) for _ in range(3)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(self.timeout)
        assert fc.active_children() == []
        for p in procs:
            assert p.job_status() in (JobStatus.EXITED, JobStatus.UNKNOWN)

    # -- a master that dies ------------------------------------------------------------------------
    def test_a_master_killed_with_sigkill_leaves_no_job(self, tmp_path: Any) -> None:
        """Nothing is left running when a master dies without a word (SIGKILL: no exit
        handler runs): its jobs end by themselves, without ``fiber cleanup``."""
        session, master = self._killed_master(tmp_path)
        try:
            plugins = fc.get_runtime().plugins
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                left = [j for j in plugins.list_jobs(session) if j.status in (JobStatus.RUNNING, JobStatus.PENDING)]
                if not left:
                    break
                time.sleep(0.5)
            else:
                raise AssertionError(f"jobs of a master killed with SIGKILL still run after {self.timeout} s: {left}")
        finally:
            if master.poll() is None:
                master.kill()
            fc.get_runtime().plugins.cleanup_jobs(session)

    def _killed_master(self, tmp_path: Any) -> tuple[str, Any]:
        """Start a master (another process) that starts a long job, says its session once the
        job runs, and kills itself with SIGKILL: (session, the master's Popen) once it is dead."""
        import json
        import subprocess
        import sys

        script = tmp_path / "killed_master.py"
        script.write_text(_KILLED_MASTER)
        env = {**os.environ, "FIBER_CONFORMANCE_INIT": json.dumps({"backend": self.backend, **self.config},
                                                                   default=str)}
        master = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
        assert master.stdout is not None
        session = master.stdout.readline().strip()  # once its job runs
        assert master.wait(self.timeout) == -signal.SIGKILL, f"the master ended otherwise: {session!r}"
        return session, master

    # -- fiber cleanup ----------------------------------------------------------------------------
    def test_cleanup_without_a_session_removes_only_the_jobs_of_a_gone_master(self, tmp_path: Any) -> None:
        """``fiber_cleanup_jobs(None)`` (``fiber cleanup``): the job of a master killed with
        SIGKILL is removed; the job of a running program (this one) is not."""

        live = fc.Process(target=sleep_for, args=(300,))
        live.start()
        master = None
        try:
            session, master = self._killed_master(tmp_path)
            plugins = fc.get_runtime().plugins
            removed = plugins.cleanup_jobs(None)
            if not self.jobs_end_with_their_master:
                assert removed >= 1, "nothing of the killed master's session was removed"
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                if not [j for j in plugins.list_jobs(session) if j.status == JobStatus.RUNNING]:
                    break
                time.sleep(0.5)
            else:
                raise AssertionError(f"the killed master's jobs still run: {plugins.list_jobs(session)}")
            assert live.is_alive(), "fiber cleanup removed the job of a master that still runs"
        finally:
            if master is not None and master.poll() is None:
                master.kill()
            live.terminate()
            live.join(self.timeout)


#: A master that starts one long job, says its session, and is killed with SIGKILL.
_KILLED_MASTER = """
import json, os, signal
import fibercore as fc
from fibercore.testing.targets import sleep_for

if __name__ == "__main__":
    fc.init(**json.loads(os.environ["FIBER_CONFORMANCE_INIT"]))
    p = fc.Process(target=sleep_for, args=(300,))
    p.start()
    print(fc.get_runtime().session, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""
