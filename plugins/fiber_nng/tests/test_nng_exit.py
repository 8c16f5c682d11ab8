"""A process that used nng ends cleanly while its threads are still inside nng: pynng's own
exit hook (``nng_fini()``) destroyed nng's locks under them and aborted the process
(``panic: pthread_mutex_lock: Invalid argument``; CPython's ``test_many_processes`` saw a job
die of SIGABRT after its work). fiber-nng takes that hook out. Each check runs in a process
of its own, so that an abort is seen as one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).parents[3]

EXIT_HOOKS_UNDER_SENDS = textwrap.dedent("""
    import atexit, os, threading, time
    import pynng
    import fiber_nng.transport  # replaces pynng's exit hook

    exchanged = [0]

    def pair():
        a = pynng.Pair0(listen="tcp://127.0.0.1:0")
        port = int(str(a.listeners[0].local_address).rsplit(":", 1)[1])
        b = pynng.Pair0(dial=f"tcp://127.0.0.1:{port}")
        a.recv_timeout = 20
        return a, b

    def exchange():  # sends and receives; a pair closed under it is made again
        while True:
            try:
                a, b = pair()
            except Exception:
                continue
            while True:
                try:
                    b.send(b"x" * 100)
                    a.recv()
                    exchanged[0] += 1
                except pynng.Closed:
                    break
                except Exception:
                    pass

    for _ in range(3):
        threading.Thread(target=exchange, daemon=True).start()
    while exchanged[0] < 100:
        time.sleep(0.001)
    for _ in range(150):  # the exit hooks, as a job runs them before os._exit
        atexit._run_exitfuncs()
        time.sleep(0.003)
    print("ended", flush=True)
    os._exit(0)
""")


def test_exit_hooks_run_while_threads_send_over_nng():
    """Three threads exchange messages over nng while the process's exit hooks run 150 times:
    the process ends normally (with pynng's hook in place, most runs abort)."""
    run = subprocess.run([sys.executable, "-c", EXIT_HOOKS_UNDER_SENDS], capture_output=True,
                         text=True, timeout=120, cwd=ROOT)
    assert "panic" not in run.stderr, run.stderr[-2000:]
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.split() == ["ended"]


def test_jobs_whose_threads_still_send_end_with_exit_code_0():
    """20 jobs over fiber-nng, each leaving a thread that sends over a Pipe as its target
    returns: every one ends with exit code 0 (before the fix, most runs lost one or more to
    SIGABRT)."""
    env = dict(os.environ, FIBER_PLUGINS="fiber_nng.plugin:plugin", FIBER_TRANSPORT="nng")
    for _ in range(2):
        run = subprocess.run([sys.executable, str(Path(__file__).with_name("exit_chatter.py")), "20"],
                             capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
        assert "panic" not in run.stderr, run.stderr[-2000:]
        assert run.returncode == 0, (run.stdout, run.stderr[-2000:])


NO_FINI_AT_EXIT = textwrap.dedent("""
    import atexit
    import pynng.nng
    import fiber_nng.transport

    class Lib:  # nng's functions, recording a call of nng_fini
        def __init__(self, lib):
            self.lib, self.finis = lib, 0

        def nng_fini(self):
            self.finis += 1

        def __getattr__(self, name):
            return getattr(self.lib, name)

    pynng.nng.lib = recorder = Lib(pynng.nng.lib)
    atexit._run_exitfuncs()
    print("nng_fini", recorder.finis, flush=True)
""")


def test_no_exit_hook_calls_nng_fini_once_fiber_nng_is_imported():
    """The property itself, without a race: after ``import fiber_nng.transport`` the exit hooks
    never call ``nng_fini()`` (pynng registers one that does)."""
    run = subprocess.run([sys.executable, "-c", NO_FINI_AT_EXIT], capture_output=True, text=True, timeout=60,
                         cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["nng_fini", "0"]


def test_a_master_leaving_with_connected_pipes_and_a_queue_ends():
    """Without pynng's exit hook, the sockets still open when the interpreter finalizes are
    left to the process's end (closing one then could wait for nng's reaper thread forever):
    a master holding 4 connected Pipes to daemon children and a Queue ends, 3 times."""
    env = dict(os.environ, FIBER_PLUGINS="fiber_nng.plugin:plugin", FIBER_TRANSPORT="nng")
    for _ in range(3):
        run = subprocess.run([sys.executable, str(Path(__file__).with_name("exit_holding.py")), "4"],
                             capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        assert "panic" not in run.stderr, run.stderr[-2000:]
        assert run.returncode == 0 and run.stdout.split() == ["leaving"], (run.stdout, run.stderr[-2000:])
