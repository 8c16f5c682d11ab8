"""The ``fiber`` command on the local backend, run as a user runs it: a subprocess, its exit code, its output."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fibercore.cli import COMMANDS
from fibercore.testing.cli import fiber, fiber_command, interrupt_when
from tests.helpers import session_processes

APP = '''
import sys, time
import fibercore as mp

def square(x):
    return x * x

if __name__ == "__main__":
    with mp.Pool(2) as pool:
        print("squares", pool.map(square, range(6)), flush=True)
    if sys.argv[1:] == ["wait"]:
        with mp.Pool(2) as pool:
            print("waiting", flush=True)
            pool.map(time.sleep, [120, 120])
    sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
'''

LOCAL = {"FIBER_BACKEND": "local"}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(APP)
    return tmp_path


def test_run_prints_the_programs_output_and_returns_its_exit_code(project):
    done = fiber("run", "--", "python", "app.py", cwd=project, env=LOCAL)
    assert done.returncode == 0, done.stderr
    assert "squares [0, 1, 4, 9, 16, 25]" in done.stdout
    assert re.search(r"fiber run: session [0-9a-f]+, master job \d+ on local", done.stderr)
    done = fiber("run", "--", "python", "app.py", "7", cwd=project, env=LOCAL)
    assert done.returncode == 7 and "squares" in done.stdout


def test_ctrl_c_stops_the_master_and_every_job_of_its_session(project):
    code, out, err = interrupt_when(["run", "--", "python", "app.py", "wait"], "waiting", cwd=project, env=LOCAL)
    assert code == 130, err
    session = re.search(r"session ([0-9a-f]+)", err).group(1)
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"fiber run: interrupted; the master \(\d+\) and every job of session {session} "
                        r"are stopped", last), err
    deadline = time.monotonic() + 10
    while session_processes(session) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert session_processes(session) == []


def test_ps_logs_cp_and_stop_find_a_running_session_from_another_process(project, tmp_path_factory):
    proc = subprocess.Popen([*fiber_command(), "run", "--", "python", "app.py", "wait"], cwd=project,
                            env={**os.environ, **LOCAL}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "waiting" in line:
                break
        listed = fiber("ps", env=LOCAL)
        assert listed.returncode == 0
        rows = [line.split() for line in listed.stdout.splitlines()[1:]]
        masters = [r for r in rows if r[2] == "master"]
        assert len(masters) == 1, listed.stdout
        session, master = masters[0][0], masters[0][1]
        workers = [r for r in rows if r[0] == session and r[2].startswith("Pool-")]
        assert len(workers) == 2 and all(r[3] == "running" for r in workers), listed.stdout
        assert fiber("ps", "--session", "nope", env=LOCAL).stdout.startswith("no fiber jobs")
        # cp into and out of the master's working directory
        src = tmp_path_factory.mktemp("cp") / "note.txt"
        src.write_text("hello job")
        assert fiber("cp", str(src), f"{master}:copied.txt", env=LOCAL).returncode == 0
        assert (project / "copied.txt").read_text() == "hello job"
        back = src.parent / "back.txt"
        assert fiber("cp", f"{master}:app.py", str(back), env=LOCAL).returncode == 0
        assert back.read_text() == APP
        bad = fiber("cp", "a.txt", "b.txt", env=LOCAL)
        assert bad.returncode == 2 and "exactly one of SRC and DST must be JOB:PATH" in bad.stderr
        logs = fiber("logs", master, env=LOCAL)  # the master job's output is on fiber run's terminal
        assert logs.returncode == 2 and "fiber run's terminal" in logs.stderr
        assert len(logs.stderr.strip().splitlines()) == 1, logs.stderr
        stopped = fiber("stop", session, env=LOCAL)
        assert stopped.returncode == 0 and f"of session {session}" in stopped.stdout
        assert proc.wait(30) == 128 + 15  # the master ended by SIGTERM, as the run reports
        deadline = time.monotonic() + 10
        while session_processes(session) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert session_processes(session) == []
        assert fiber("stop", session, env=LOCAL).returncode == 1  # nothing left to stop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


TALKER = '''
import sys, time
import fibercore as mp

def talk(i):
    print(f"worker {i} says hello", flush=True)
    time.sleep(600)

if __name__ == "__main__":
    from fibercore.runtime import get_runtime

    pool = mp.Pool(2)
    for i in range(2):
        pool.apply_async(talk, (i,))
    print(get_runtime().session, flush=True)
    sys.stdin.read()
    pool.terminate()
'''


def test_logs_shows_a_running_local_jobs_output_from_another_terminal(tmp_path):
    """`fiber logs SESSION` and `fiber logs JOB` of a running local program show what its
    workers printed (its master keeps the copy and answers through the status directory),
    exit 0, six of them at once too, after junk was written into the request file; once the
    program ended both forms say, in one line and exit code 2 (nothing on stdout), that local
    output went to the master's terminal."""
    (tmp_path / "talker.py").write_text(TALKER)
    env = {**os.environ, **LOCAL, "FIBER_STATUS_DIR": str(tmp_path / "status")}
    (tmp_path / "status").mkdir(mode=0o700)
    proc = subprocess.Popen([sys.executable, "talker.py"],
                            cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    job = None
    try:
        assert proc.stdout is not None
        session = proc.stdout.readline().strip()
        deadline = time.monotonic() + 60
        while True:  # until both workers have printed (each starts and prints on its own)
            logs = fiber("logs", session, env=env)
            if logs.stdout.count("says hello") == 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert logs.returncode == 0, logs.stderr
        assert re.findall(r"==> Pool-1-Worker-\d \((\d+), running\) <==", logs.stdout) and \
            sorted(re.findall(r"worker (\d) says hello", logs.stdout)) == ["0", "1"], logs.stdout
        job = re.search(r"==> Pool-1-Worker-\d \((\d+), running\) <==\nworker (\d)", logs.stdout)
        one = fiber("logs", job.group(1), env=env)
        assert one.returncode == 0 and one.stdout == f"worker {job.group(2)} says hello\n", one
        # several at once share the master's answers; junk in the request file changes nothing
        (tmp_path / "status" / f"{session}.logs-wanted").write_text("[" * 200_000 + "]" * 200_000)
        both = [subprocess.Popen([*fiber_command(), "logs", target], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for target in (session, job.group(1)) * 3]
        for p in both:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0 and "says hello" in out, (out, err)
    finally:
        proc.stdin.close()
        proc.wait(60)
    assert job is not None
    for target in (session, job.group(1)):
        after = fiber("logs", target, env=env)
        assert after.returncode == 2 and after.stdout == "", after
        assert len(after.stderr.strip().splitlines()) == 1 and "goes to the terminal of the master" in after.stderr


@pytest.mark.parametrize("args, message", [
    (["run", "--env", "1BAD=x", "--", "python", "app.py"], "--env '1BAD=x' is not NAME=VALUE"),
    (["run", "--env", "NOEQUALS", "--", "python", "app.py"], "is not NAME=VALUE"),
    (["run", "--backend", "nosuch", "--", "python", "app.py"], "unknown fibercore backend 'nosuch'"),
    (["run"], "no program to run: give it after --"),
    (["run", "--detach", "--", "python", "app.py"], "--detach needs a cluster backend"),
    (["run", "--push", "127.0.0.1:5000", "--", "python", "app.py"], "--push pushes the image --build makes"),
    (["config", "no_such_key"], "unknown fibercore config key 'no_such_key'"),
    (["logs", "999999999"], "no local job or session '999999999' runs"),
])
def test_bad_input_is_one_line_naming_the_fix_and_exit_code_2(project, args, message):
    done = fiber(*args, cwd=project, env=LOCAL)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.builtin_transport
def test_config_says_where_each_value_came_from(tmp_path):
    (tmp_path / ".fiberconfig").write_text("[default]\nstart_timeout = 33\n")
    done = fiber("config", cwd=tmp_path, env={**LOCAL, "FIBER_POOL_PROCESSES": "3"})
    assert done.returncode == 0
    assert "pool_processes = 3  (environment variable FIBER_POOL_PROCESSES; fibercore)" in done.stdout
    assert "transport: tcp (fibercore.builtins.tcp_transport); serializer: cloudpickle" in done.stdout
    assert re.search(r"start_timeout = 33.0  \(.*\.fiberconfig.*\)", done.stdout), done.stdout
    everything = fiber("config", "--all", cwd=tmp_path, env=LOCAL).stdout
    assert "heartbeat_interval = 2.0  (default; fibercore)" in everything
    assert "local_echo_output = True  (default; fiber-local)" in everything


@pytest.mark.builtin_transport
def test_doctor_checks_the_local_backend(tmp_path):
    done = fiber("doctor", "--backend", "local", cwd=tmp_path)
    assert done.returncode == 0, done.stdout
    assert "ok   /dev/shm writable" in done.stdout and "no problems found" in done.stdout
    assert done.stdout.startswith("transport: tcp (fibercore.builtins.tcp_transport); serializer: cloudpickle")


def test_doctor_names_the_fix_for_what_fails():
    from fibercore.plugins import installed_backends

    if "docker" not in installed_backends():
        pytest.skip("fiber-docker is not installed (scripts/drift's core-only venv)")
    done = fiber("doctor", "--backend", "docker", env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert done.returncode == 1
    assert "no   Docker daemon reachable" in done.stdout and "fix: start dockerd" in done.stdout


def test_every_command_has_help_and_backends_lists_plugins():
    for command in COMMANDS:
        done = fiber(command, "--help")
        assert done.returncode == 0 and f"usage: fiber {command}" in done.stdout
    listed = fiber("backends", env=LOCAL)
    assert listed.returncode == 0 and "fiber-local" in listed.stdout and "contract" in listed.stdout
