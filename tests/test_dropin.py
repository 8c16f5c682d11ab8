"""multiprocessing programs as users write them: each test is a way a drop-in broke.

Programs whose ``__main__`` matters run as real scripts in a subprocess (with a
deadline: a hang is a failure, not a stuck suite).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fibercore as mp


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (from /proc: its threads' children, recursively)."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for child in children:
            found += [child, *_descendants(child)]
    return found


def run_script(tmp_path: Path, source: str, timeout: float = 60.0, args: tuple[str, ...] = (),
               **kw) -> subprocess.CompletedProcess[str]:
    """Run ``source`` as a main script; fail (not hang) if it does not end in ``timeout``,
    with where each of its processes was stuck (faulthandler's stacks, on SIGABRT)."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(source))
    env = {**(kw.pop("env", None) or os.environ), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=tmp_path, env=env, **kw)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for pid in [*_descendants(proc.pid), proc.pid]:  # the program's own processes, by PID
            try:
                os.kill(pid, signal.SIGABRT)
            except ProcessLookupError:
                continue
            time.sleep(0.3)  # one dump at a time on the shared stderr
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"the program did not end within {timeout} s; its output:\n{out}\n"
                             f"its stacks when it was stopped (SIGABRT):\n{err[-20000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.fixture(scope="module")
def pool():
    p = mp.Pool(2)
    yield p
    p.terminate()


# -- a function that holds numpy arrays (out-of-band buffers in its pickle) ------------------
SIZES = st.lists(st.sampled_from([0, 8, 600, 2048, 70_000]), max_size=6)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(sizes=SIZES)
def test_functions_holding_arrays_run_in_pool(pool, sizes):
    """0, 1 or many out-of-band buffers in the function's pickle (arrays ≥ 4 KiB go out of band)."""
    arrays = [np.arange(float(n)) for n in sizes]

    def f(x):
        return x + sum(float(a.sum()) for a in arrays)

    expected = [f(x) for x in range(7)]
    assert pool.map(f, range(7)) == expected
    assert list(pool.imap(f, range(3))) == expected[:3]
    assert pool.apply(f, (4,)) == expected[4]


def test_main_function_over_numpy_array(tmp_path):
    out = run_script(tmp_path, """
        import numpy as np
        import fibercore as mp
        W = np.arange(2048.0)
        def f(x):
            return W[x]
        if __name__ == "__main__":
            with mp.Pool(2) as p:
                print(p.map(f, range(5)))
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[np.float64(0.0), np.float64(1.0), np.float64(2.0), np.float64(3.0), np.float64(4.0)]"


# -- __main__ globals: initializers, caches, parameters ------------------------------------
def test_initializer_global_and_module_cache_in_main(tmp_path):
    """The most common Pool idiom, with mp's results side by side in the same program."""
    out = run_script(tmp_path, """
        import multiprocessing
        import fibercore
        model = None
        builds = 0
        _cache = {}
        theta = 1
        def init():
            global model
            model = 10
        def task(x):
            return model * x
        def cached(x):
            global builds
            if "env" not in _cache:
                builds += 1
                _cache["env"] = object()
            return builds
        def use_theta(x):
            return theta
        def run(ctx):
            with ctx.Pool(2, initializer=init) as p:
                squares = p.map(task, range(5))
                builds_seen = max(max(p.map(cached, range(4), chunksize=1)) for _ in range(7))
                return squares, builds_seen
        if __name__ == "__main__":
            print(run(multiprocessing.get_context("spawn")))
            print(run(fibercore))
            with fibercore.Pool(2) as p:
                first = p.map(use_theta, range(4))
                theta = 2  # rebound in the master: the workers see the new value
                print(first, p.map(use_theta, range(4)))
    """)
    assert out.returncode == 0, out.stderr
    mp_line, fiber_line, theta_line = out.stdout.strip().splitlines()
    assert fiber_line == mp_line == "([0, 10, 20, 30, 40], 1)"
    assert theta_line == "[1, 1, 1, 1] [2, 2, 2, 2]"


# -- lifetimes: forgotten pools and managers --------------------------------------------------
def test_forgotten_pool_and_manager_do_not_hang_exit(tmp_path):
    """Never closed, never shut down: the program still ends at once and leaves no job."""
    out = run_script(tmp_path, """
        import os
        import fibercore as mp
        def sq(x):
            return x * x
        def leak_a_pool():
            p = mp.Pool(2)
            return p.map(sq, range(4))
        if __name__ == "__main__":
            print(leak_a_pool())          # collected while the program runs
            pool = mp.Pool(2)             # still referenced at exit
            print(pool.map(sq, range(3)))
            m = mp.Manager()
            d = m.dict()
            d["a"] = 1
            print(dict(d))
            print("pids", " ".join(str(c.pid) for c in mp.active_children()))
    """, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:3] == ["[0, 1, 4, 9]", "[0, 1, 4]", "{'a': 1}"]
    assert "Traceback" not in out.stderr, out.stderr
    for pid in map(int, lines[3].split()[1:]):
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower()


def test_collecting_a_pool_never_blocks_on_its_lock():
    """The collector may run anywhere, even while another thread holds the scheduler's lock."""
    import gc
    import threading
    import time

    pool = mp.Pool(1)
    assert pool.map(abs, [-1]) == [1]
    core = pool._core
    workers = core.worker_processes()
    holding, release = threading.Event(), threading.Event()

    def hold_lock():
        with core.lock:
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold_lock)
    holder.start()
    holding.wait(10)
    del pool
    t0 = time.monotonic()
    gc.collect()
    took = time.monotonic() - t0
    release.set()
    holder.join()
    # the holder keeps the lock for 30 s: a collection that waited for it would take that long
    assert took < 15, f"gc.collect() blocked {took:.1f} s on the pool's lock"
    deadline = time.monotonic() + 30
    while any(w.is_alive() for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(w.is_alive() for w in workers), "the collected pool's workers were not stopped"


def test_manager_start_and_shutdown_leave_no_socket_open():
    def open_fds():
        return len(list(Path("/proc/self/fd").iterdir()))

    for _ in range(2):  # warm-up: the admin hub, the manager client machinery
        with mp.Manager() as m:
            m.dict()
    before = open_fds()
    for _ in range(4):
        with mp.Manager() as m:
            m.dict()
    # Closed, not necessarily gone yet: a transport may end a connection on a thread of its
    # own (fiber-nng's reaper, a moment later). A socket left open stays, and fails this.
    deadline = time.monotonic() + 10.0
    while open_fds() - before > 1:
        assert time.monotonic() < deadline, "a socket (or more) per manager is left open"
        time.sleep(0.01)


# -- fibercore objects in children that multiprocessing (or a library) starts ---------------
@pytest.mark.forks_master
def test_queue_pipe_and_proxy_in_plain_multiprocessing_children(tmp_path):
    """spawn and forkserver get the session's credentials in the start-up pipe; a forked
    child inherits them and opens connections of its own (the reactor thread is new)."""
    out = run_script(tmp_path, """
        import multiprocessing
        import fibercore
        def child(q, conn, d):
            q.put("queue")
            conn.send("pipe")
            d["seen"] = d.get("seen", 0) + 1
        if __name__ == "__main__":
            q = fibercore.Queue()
            q.put("warm-up"); q.get()  # the transport in use before the fork
            m = fibercore.Manager()
            d = m.dict()
            for method in ("fork", "spawn", "forkserver"):
                a, b = fibercore.Pipe()
                p = multiprocessing.get_context(method).Process(target=child, args=(q, b, d))
                p.start()
                got = (q.get(timeout=20), a.recv() if a.poll(20) else "no pipe message")
                p.join(20)
                print(method, got, p.exitcode)
            print("proxy", d["seen"])
            m.shutdown()
    """, timeout=90)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "fork ('queue', 'pipe') 0", "spawn ('queue', 'pipe') 0", "forkserver ('queue', 'pipe') 0", "proxy 3"]
    assert "dropped a frame" not in out.stderr, out.stderr


@pytest.mark.forks_master
def test_gymnasium_async_vector_env_feeds_a_fibercore_queue(tmp_path):
    """A library that starts its own children: each env reports its steps to a fibercore queue."""
    pytest.importorskip("gymnasium")
    out = run_script(tmp_path, """
        import gymnasium as gym
        import fibercore
        class Report(gym.Wrapper):
            def __init__(self, env, q, index):
                super().__init__(env)
                self.q, self.index, self.steps = q, index, 0
            def step(self, action):
                self.steps += 1
                self.q.put((self.index, self.steps))
                return self.env.step(action)
        def make(q, index):
            return lambda: Report(gym.make("CartPole-v1"), q, index)
        if __name__ == "__main__":
            for context in ("fork", "spawn", "forkserver"):
                q = fibercore.Queue()
                envs = gym.vector.AsyncVectorEnv([make(q, i) for i in range(2)], context=context)
                envs.reset(seed=0)
                for _ in range(5):
                    envs.step(envs.action_space.sample())
                got = sorted(q.get(timeout=20) for _ in range(10))
                envs.close()
                print(context, got == sorted((i, k) for i in range(2) for k in range(1, 6)))
    """, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["fork", "True", "spawn", "True", "forkserver", "True"]


def test_stable_baselines3_subproc_vec_env_steps_as_its_dummy_vec_env_and_ppo_trains(tmp_path):
    """stable-baselines3's ``SubprocVecEnv(env_fns, start_method="fiber")``, as an RL user
    writes it (env factories in ``__main__``): the same observations, rewards and dones as its
    in-process ``DummyVecEnv`` for the same seeds and actions, then PPO for 3,072 steps on it."""
    pytest.importorskip("stable_baselines3")
    out = run_script(tmp_path, """
        import gymnasium as gym
        import numpy as np
        import fibercore  # registers the "fiber" start method
        from stable_baselines3 import PPO
        from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

        def make(seed):
            def thunk():
                env = gym.make("CartPole-v1")
                env.reset(seed=seed)
                return env
            return thunk

        def run(vec, actions):
            vec.seed(7)
            seen = [vec.reset()]
            for a in actions:
                obs, reward, done, _ = vec.step(a)
                seen += [obs, reward, done]
            vec.close()
            return seen

        if __name__ == "__main__":
            actions = np.random.default_rng(0).integers(0, 2, size=(60, 2))
            here = run(DummyVecEnv([make(i) for i in range(2)]), actions)
            there = run(SubprocVecEnv([make(i) for i in range(2)], start_method="fiber"), actions)
            print("same", all(np.array_equal(a, b) for a, b in zip(here, there, strict=True)))
            vec = SubprocVecEnv([make(i) for i in range(2)], start_method="fiber")
            model = PPO("MlpPolicy", vec, n_steps=256, batch_size=128, n_epochs=2, seed=0, device="cpu")
            model.learn(total_timesteps=3072)
            print("trained", model.num_timesteps >= 3072)
            vec.close()
    """, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split()[-4:] == ["same", "True", "trained", "True"], out.stdout + out.stderr[-2000:]


def test_nevergrad_minimizes_through_the_fibercore_executor_as_through_its_own(tmp_path):
    """Nevergrad's ``minimize(f, executor=...)``, as its docs show it with
    ``ProcessPoolExecutor``: the same optimiser and seed through ``fibercore.Executor`` with one
    worker (calls then finish in the order they were asked) recommends exactly what the same
    search evaluated in one process does; with 4 workers every call of the budget is told and
    the recommendation is no worse than the first point asked."""
    pytest.importorskip("nevergrad")
    out = run_script(tmp_path, """
        import os
        import numpy as np
        import nevergrad as ng
        import fibercore as mp

        def sphere(x):
            return float(np.sum((x - 0.5) ** 2)), os.getpid()

        def loss(x):
            return sphere(x)[0]

        def where(x):
            return sphere(x)[1]

        def search(executor, workers):
            opt = ng.optimizers.OnePlusOne(parametrization=ng.p.Array(shape=(3,)), budget=80,
                                           num_workers=workers)
            opt.parametrization.random_state = np.random.RandomState(7)
            best = opt.minimize(loss, executor=executor)
            return best.value, opt.num_tell

        if __name__ == "__main__":
            here, _ = search(None, 1)
            with mp.Executor(max_workers=1) as ex:
                there, _ = search(ex, 1)
                pids = {ex.submit(where, np.zeros(3)).result() for _ in range(3)}
            print("same", np.array_equal(here, there), "elsewhere", os.getpid() not in pids)
            with mp.Executor(max_workers=4) as ex:
                best, told = search(ex, 4)
            # the order calls finish in decides the search with 4 workers: every call was told,
            # and the recommendation is no worse than the first point asked (the centre)
            print("all", told == 80, "improved", loss(best) <= loss(np.zeros(3)))
    """, timeout=170)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["same", "True", "elsewhere", "True", "all", "True", "improved", "True"], out.stdout


def test_worker_lost_error_names_the_items_and_the_likely_cause():
    from fibercore.errors import WorkerLostError
    from tests import pool_tasks as T

    with mp.Pool(2, max_task_retries=0) as p:
        with pytest.raises(WorkerLostError) as info:
            p.map(T.exit_at, range(40), chunksize=10)
    message = str(info.value)
    assert "items 20-29 of map(exit_at) were lost" in message
    assert "exited with status 3" in message and "out-of-memory" not in message


def test_workers_see_the_parents_argv(tmp_path):
    out = run_script(tmp_path, """
        import sys
        import fibercore as mp
        def argv(_):
            return sys.argv[1:]
        if __name__ == "__main__":
            with mp.Pool(1) as p:
                print(p.apply(argv, (0,)))
    """, timeout=30, args=("--lr", "0.1"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['--lr', '0.1']"


def test_cli_errors_are_messages_not_tracebacks():
    env = {**__import__("os").environ, "FIBER_BACKEND": "nosuch"}
    out = subprocess.run([sys.executable, "-m", "fibercore.cli", "backends"], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr and "unknown fibercore backend 'nosuch'" in out.stderr
    version = subprocess.run([sys.executable, "-m", "fibercore.cli", "--version"], capture_output=True, text=True,
                             timeout=60)
    assert version.returncode == 0 and version.stdout.startswith(f"fibercore {mp.__version__}")


def test_cleanup_without_session_spares_jobs_of_a_live_master():
    from tests import helpers

    p = mp.Process(target=helpers.sleep_then_put, args=(mp.Queue(), 30))
    p.start()
    try:
        out = subprocess.run([sys.executable, "-m", "fibercore.cli", "cleanup", "--backend", "local"],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert p.is_alive(), "fiber cleanup killed the job of a master that is still running"
    finally:
        p.kill()
        p.join(10)


# -- pipes whose other end died ---------------------------------------------------------------
def test_pipe_send_to_a_dead_peer_raises_and_nothing_blocks(tmp_path):
    """multiprocessing raises BrokenPipeError; close() and exit must not wait for a reader
    that is gone, even with 64 MiB and more queued (the script must end)."""
    out = run_script(tmp_path, """
        import time
        import fibercore as mp
        def take_one(conn):
            conn.recv()
        if __name__ == "__main__":
            a, b = mp.Pipe()
            p = mp.Process(target=take_one, args=(b,))
            p.start()
            a.send("one")
            p.join(30)
            raised, sent = None, 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    a.send_bytes(b"x" * (1 << 20))
                    sent += 1
                except BrokenPipeError as exc:
                    raised = exc
                    break
            print("raised", type(raised).__name__)
            t0 = time.monotonic()
            a.close()
            print("close took under 2 s", time.monotonic() - t0 < 2)
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["raised BrokenPipeError", "close took under 2 s True"]


def test_closing_a_pipe_end_after_the_other_process_exited(tmp_path):
    """The multiprocessing documentation's Pipe example, with both ends closed at the end."""
    for _ in range(5):
        out = run_script(tmp_path, """
            from fibercore import Process, Pipe
            def f(conn):
                conn.send([42, None, 'hello'])
                conn.close()
            if __name__ == '__main__':
                parent_conn, child_conn = Pipe()
                p = Process(target=f, args=(child_conn,))
                p.start()
                print(parent_conn.recv())
                p.join()
                parent_conn.close()
                child_conn.close()
        """, timeout=20)
        assert out.returncode == 0 and out.stdout == "[42, None, 'hello']\n", out.stderr


# -- programs written for uber/fiber 0.2.1, with only the import changed ------------------------
def test_program_written_for_the_original_fiber(tmp_path):
    out = run_script(tmp_path, """
        import fibercore as fiber
        from fibercore import SimpleQueue, Process
        from fibercore.experimental import Ring
        from fibercore.managers import AsyncManager

        def square(x):
            return x * x

        @fiber.meta(cpu=1)
        def produce(q):
            q.put("from a job")

        if __name__ == "__main__":
            fiber.init(cpu_per_job=1, start_timeout=60)
            print(fiber.config.cpu_per_job, fiber.config.get_dict()["start_timeout"])
            pool = fiber.Pool(2, error_handling=True)
            pool.start_workers()
            print(pool.wait_until_workers_up(60), pool.map(square, range(4)))
            pool.terminate()
            q = SimpleQueue()
            p = Process(target=produce, args=(q,))
            p.start()
            print(q.get())
            p.join()
            print(Ring.__name__, AsyncManager.__name__, fiber.cpu_count() >= 1)
            fiber.reset()
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["1.0 60.0", "True [0, 1, 4, 9]", "from a job", "Ring AsyncManager True"]


def test_pipe_ends_in_one_process_and_data_sent_before_the_child_exists():
    """Both ends here: readable at once (as an OS pipe); what was sent before the other end
    went to a child reaches the child."""
    from tests import helpers

    a, b = mp.Pipe()
    assert a.poll() is False
    b.send_bytes(b"")
    assert a.poll() is True and a.recv_bytes() == b""
    a.send([1, 2])
    a.send("three")
    out = mp.Queue()
    p = mp.Process(target=helpers.pipe_forward, args=(b, out, 2))
    p.start()
    assert out.get(timeout=30) == [[1, 2], "three"]
    p.join(30)
    assert p.exitcode == 0


def test_connection_fileno_works_with_selectors_and_mp_wait():
    import multiprocessing.connection
    import selectors

    from tests import helpers

    a, b = mp.Pipe()
    p = mp.Process(target=helpers.pipe_bytes_echo, args=(b,))
    p.start()
    sel = selectors.DefaultSelector()
    sel.register(a, selectors.EVENT_READ)
    assert sel.select(0.2) == []
    a.send_bytes(b"ping")
    assert [key.fileobj for key, _ in sel.select(30)] == [a]
    assert multiprocessing.connection.wait([a], 5) == [a]
    assert a.recv_bytes() == b"pingping"
    p.join(30)
    # The child has ended: as an OS pipe at EOF, the end is readable and recv() raises.
    assert [key.fileobj for key, _ in sel.select(10)] == [a]
    with pytest.raises(EOFError):
        a.recv()
    sel.close()
    local_a, local_b = mp.Pipe()  # both ends here: in memory, same descriptor semantics
    assert multiprocessing.connection.wait([local_a], 0.1) == []
    local_b.send(1)
    assert multiprocessing.connection.wait([local_a], 5) == [local_a] and local_a.recv() == 1


def test_a_jobs_child_outlives_its_terminated_parent_briefly_then_leaves():
    """As multiprocessing: the grandchild sees parent_process() die and can still report;
    then it exits by itself (a dead parent leaves no orphan)."""
    import os
    import time

    from tests import helpers

    r, w = mp.Pipe(duplex=False)
    p = mp.Process(target=helpers.start_reporter_then_wait, args=(w,))
    p.start()
    assert r.poll(60)
    pid, alive = r.recv()
    assert alive is True
    p.terminate()
    p.join(30)
    assert r.poll(30) and r.recv() == (pid, False)
    deadline = time.monotonic() + 10
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{pid}"), "the grandchild was left running"


def test_a_child_forked_from_a_master_gets_the_default_sigterm(tmp_path):
    """The master's SIGTERM handler (stop every job) is not inherited by a process forked
    from it: there SIGTERM ends the process at once, as without fibercore. A Python-level
    handler in a fork child can miss a SIGTERM that lands just before a blocking wait
    (CPython runs handlers between bytecodes), which hung ``Pool.terminate()``."""
    out = run_script(tmp_path, """
        import os, signal
        import fibercore as mp
        from fibercore.testing.conformance import sleep_for

        if __name__ == "__main__":
            job = mp.Process(target=sleep_for, args=(60,))
            job.start()
            print("master handles SIGTERM", signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None))
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.write(w, b"default" if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL else b"ours")
                os._exit(0)
            os.waitpid(pid, 0)
            print("fork child's SIGTERM", os.read(r, 16).decode())
            job.kill()
            job.join(10)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["master handles SIGTERM True", "fork child's SIGTERM default"]


def test_a_multiprocessing_fork_child_of_a_master_leaves_its_jobs_alone(tmp_path):
    """A multiprocessing fork Pool in a fibercore master: terminating it (SIGTERM to its
    children) must neither hang nor let the forked children stop the master's own jobs with
    the SIGTERM handler they inherited."""
    out = run_script(tmp_path, """
        import os, time, multiprocessing
        import fibercore as mp
        from fibercore.testing.conformance import sleep_for

        def noop(x):
            return x

        if __name__ == "__main__":
            job = mp.Process(target=sleep_for, args=(120,))
            job.start()
            with mp.Pool(2) as ours:
                ours.map(noop, range(4), 1)
                before = sorted(w.pid for w in ours.workers())
                slowest = 0.0
                for _ in range(3):
                    theirs = multiprocessing.get_context("fork").Pool(2)
                    theirs.map(noop, range(8))
                    started = time.monotonic()
                    theirs.terminate()
                    theirs.join()
                    slowest = max(slowest, time.monotonic() - started)
                print("terminated in under 10 s", slowest < 10)
                print("our workers untouched", sorted(w.pid for w in ours.workers()) == before)
                print("our pool serves", ours.map(noop, range(4), 1) == [0, 1, 2, 3])
            print("our job alive", job.is_alive())
            job.kill()
            job.join(10)
    """, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["terminated in under 10 s True", "our workers untouched True",
                                       "our pool serves True", "our job alive True"]


def _glibc_register_atfork() -> bool:
    import ctypes

    return sys.platform.startswith("linux") and hasattr(ctypes.CDLL(None), "__register_atfork")


@pytest.mark.skipif(not _glibc_register_atfork(), reason="needs Linux /proc and glibc's __register_atfork")
def test_a_fork_child_of_a_master_dies_of_a_sigterm_sent_before_it_first_ran(tmp_path):
    """``Pool.terminate()`` may SIGTERM a fork worker that has not run since the fork (a busy
    machine). The signal then lands on the handler inherited from the master before CPython's
    after-fork work, which drops it: the worker lived on and ``join()`` hung. A C fork handler
    that waits for a signal puts the child at exactly that point, deterministically."""
    out = run_script(tmp_path, """
        import ctypes, os, signal, time
        import fibercore as mp
        from fibercore.testing.conformance import sleep_for

        def state(pid):
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]

        if __name__ == "__main__":
            job = mp.Process(target=sleep_for, args=(60,))
            job.start()  # the master handles SIGTERM now (it stops its jobs)
            signal.signal(signal.SIGUSR2, lambda *_: None)
            libc = ctypes.CDLL(None)
            # in the child, before the interpreter's own after-fork work: wait for a signal
            assert libc.__register_atfork(None, None, ctypes.cast(libc.pause, ctypes.c_void_p), None) == 0
            pid = os.fork()
            if pid == 0:
                os._exit(7)  # reached only if the SIGTERM was lost
            while state(pid) != "S":  # the child is in pause()
                time.sleep(0.001)
            os.kill(pid, signal.SIGTERM)
            os.kill(pid, signal.SIGUSR2)  # ends pause() should SIGTERM wait for the child's hooks
            _, status = os.waitpid(pid, 0)
            print("child ended by", signal.Signals(os.WTERMSIG(status)).name if os.WIFSIGNALED(status)
                  else f"exit {os.WEXITSTATUS(status)}")
            print("our job alive", job.is_alive())
            job.kill()
            job.join(10)
    """, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["child ended by SIGTERM", "our job alive True"]
