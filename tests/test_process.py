"""Process API details beyond the conformance suite; a dead master leaves no orphan jobs."""

from __future__ import annotations

import multiprocessing.connection
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import fibercore as mp
from fibercore.errors import JobStartError, ProcessError
from tests.helpers import session_processes, sleep_then_put


def test_repr_name_daemon_and_current_process():
    p = mp.Process(target=print, name="worker-x", daemon=True)
    assert p.name == "worker-x" and p.daemon
    assert "initial" in repr(p) and "daemon" in repr(p)
    assert mp.current_process().name == "MainProcess"
    assert mp.parent_process() is None
    assert mp.get_context("spawn") is mp.get_context() and mp.get_start_method() == "fiber"
    with pytest.raises(ValueError):
        mp.get_context("threads")
    assert issubclass(ProcessError, multiprocessing.ProcessError)


def test_sentinel_works_with_multiprocessing_wait():
    q = mp.Queue()
    p = mp.Process(target=sleep_then_put, args=(q, 0.3))
    p.start()
    ready = multiprocessing.connection.wait([p.sentinel], timeout=30)
    assert ready == [p.sentinel]
    p.join(5)
    assert p.exitcode == 0
    p.close()
    with pytest.raises(ValueError):
        p.is_alive()


def test_start_twice_and_join_unstarted():
    p = mp.Process(target=print)
    with pytest.raises(AssertionError):
        p.join()
    p.start()
    with pytest.raises(AssertionError):
        p.start()
    p.join(30)


def test_missing_interpreter_is_a_clear_process_error(fresh_runtime):
    mp.init(python_exe="/nonexistent/python3")
    with pytest.raises(ProcessError, match="could not start"):
        mp.Process(target=print).start()


def test_worker_dying_before_connecting_reports_logs(tmp_path, fresh_runtime):
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'no python in this image' >&2\nexit 3\n")
    fake.chmod(0o755)
    mp.init(python_exe=str(fake))
    with pytest.raises(JobStartError) as info:
        mp.Process(target=print).start()
    msg = str(info.value)
    assert "exited with code 3" in msg and "no python in this image" in msg


def test_worker_on_another_python_version_says_so(tmp_path, fresh_runtime):
    """A job whose Python minor version differs from the master's stops at once with the
    fix (an image of the master's version) instead of failing later on a pickle."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nFIBER_MASTER_PYTHON=2.7 exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    mp.init(python_exe=str(fake))
    with pytest.raises(JobStartError) as info:
        mp.Process(target=print).start()
    msg = str(info.value)
    here = "{}.{}".format(*sys.version_info[:2])
    assert f"this job runs Python {here}" in msg and "the master runs Python 2.7" in msg
    assert "exited with code 76" in msg


MASTER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {root!r})
    import fibercore as mp
    from fibercore.testing.conformance import sleep_for
    if __name__ == "__main__":
        mp.init(heartbeat_interval=0.5, heartbeat_timeout=3)
        p = mp.Process(target=sleep_for, args=(300,))
        p.start()
        print(p.pid, mp.get_runtime().session, flush=True)
        time.sleep(300)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split()[2] != "Z"


@pytest.mark.parametrize("template", ["forked", "new interpreter"])
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_dead_master_leaves_no_orphan_jobs(tmp_path, how, template):
    script = tmp_path / "master.py"
    script.write_text(MASTER.format(root=os.getcwd()))
    env = {**os.environ, "FIBER_LOCAL_FORK_TEMPLATE": "1" if template == "forked" else "0"}
    master = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True, env=env)
    pid, session = master.stdout.readline().split()
    child = int(pid)
    assert _alive(child)
    others = set(session_processes(session)) - {child, master.pid}
    assert len(others) == (1 if template == "forked" else 0), others  # the template process
    master.send_signal(getattr(signal, how))
    master.wait(30)
    deadline = time.monotonic() + 15
    while session_processes(session) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), f"worker {child} outlived its master ({how})"
    assert session_processes(session) == [], f"processes of the session outlived the master ({how})"


def test_fiber_cleanup_kills_leftover_workers(tmp_path):
    # A master frozen with SIGSTOP keeps its connections open: only cleanup removes the worker.
    script = tmp_path / "master.py"
    script.write_text(MASTER.format(root=os.getcwd()).replace("heartbeat_timeout=3", "heartbeat_timeout=600"))
    master = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    child, session = master.stdout.readline().split()
    master.send_signal(signal.SIGSTOP)
    try:
        out = subprocess.run([sys.executable, "-m", "fibercore.cli", "cleanup", "--session", session],
                             capture_output=True, text=True, timeout=60)
        assert "removed 1 job(s)" in out.stdout, out.stderr
        deadline = time.monotonic() + 10
        while _alive(int(child)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(int(child))
    finally:
        master.kill()
        master.wait(10)


def test_a_jobs_sys_path_is_its_masters(tmp_path):
    """Run from another directory than the script's: the job's path is the master's, not
    the job's starting directory first (python -m fibercore.worker adds it)."""
    import subprocess
    import sys
    import textwrap

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "app.py").write_text(textwrap.dedent('''
        import sys
        import fibercore as mp

        def show(q):
            import sys
            q.put(list(sys.path))

        if __name__ == "__main__":
            q = mp.SimpleQueue()
            p = mp.Process(target=show, args=(q,))
            p.start()
            child = q.get()
            p.join()
            print(child == sys.path, child[:3], sys.path[:3])
    '''))
    done = subprocess.run([sys.executable, "sub/app.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.startswith("True "), done.stdout + done.stderr


def test_job_sys_path_keeps_what_only_the_job_has():
    from fibercore.worker import job_sys_path

    assert job_sys_path(["/app", "/m/site"], ["/start", "/j/site", "/m/site"], "/start") == \
        ["/app", "/m/site", "/j/site"]
