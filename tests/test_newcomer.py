"""What a newcomer meets in the first hour, run as they would run it: each mistake is one line
on stderr that names the fix, with the exit code a script can test; Ctrl-C is quiet."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from fibercore.testing.cli import fiber

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {"FIBER_BACKEND": "local"}


def run_program(code: str, tmp_path: Path, env: dict[str, str] | None = None,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(app)], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=timeout)


POOL_APP = '''
    import fibercore as mp

    def square(x):
        return x * x

    if __name__ == "__main__":
        with mp.Pool(2) as pool:
            print(pool.map(square, range(4)))
'''


def _plugins(*more: str) -> str:
    """FIBER_PLUGINS with ``more`` added to what the suite runs with (a transport plugin)."""
    return ",".join(filter(None, [os.environ.get("FIBER_PLUGINS", ""), *more]))


def test_a_backend_that_cannot_be_reached_is_one_line_naming_the_fix(tmp_path):
    plugin = tmp_path / "down_backend.py"
    plugin.write_text(textwrap.dedent('''
        import fibercore
        from fibercore.errors import BackendUnavailableError

        FIBER_CONTRACT = 3

        class DaemonDown(RuntimeError, BackendUnavailableError):
            pass

        @fibercore.hookimpl(tryfirst=True)
        def fiber_create_job(spec, config):
            try:
                try:
                    raise ConnectionRefusedError(111, "Connection refused")
                except OSError as exc:
                    raise OSError("HTTP adapter: max retries exceeded") from exc
            except OSError as exc:
                raise DaemonDown("cannot reach the daemon at /run/down.sock: start it (sudo downd &)") from exc
    '''))
    env = {**LOCAL, "FIBER_PLUGINS": _plugins("down_backend"), "PYTHONPATH": str(tmp_path)}
    done = run_program(POOL_APP, tmp_path, env=env)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("fibercore: Pool-1 cannot run tasks: no worker can start: backend 'local' cannot start "
                               "jobs: "
                               "cannot reach the daemon at /run/down.sock: start it (sudo downd &)")
    assert lines[0].endswith("(FIBER_DEBUG=1 shows the traceback)")
    debug = run_program(POOL_APP, tmp_path, env={**env, "FIBER_DEBUG": "1"})
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "Connection refused" in debug.stderr


def test_a_process_on_an_unreachable_backend_is_one_line_too(tmp_path):
    (tmp_path / "down_backend.py").write_text(textwrap.dedent('''
        import fibercore
        from fibercore.errors import BackendUnavailableError

        @fibercore.hookimpl(tryfirst=True)
        def fiber_create_job(spec, config):
            raise BackendUnavailableError("no cluster configuration: set KUBECONFIG")
    '''))
    done = run_program('''
        import fibercore as mp
        if __name__ == "__main__":
            p = mp.Process(target=print, args=("hi",))
            p.start()
    ''', tmp_path, env={**LOCAL, "FIBER_PLUGINS": _plugins("down_backend"), "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 1
    assert done.stderr == ("fibercore: backend 'local' cannot start jobs: no cluster configuration: set "
                           "KUBECONFIG (FIBER_DEBUG=1 shows the traceback)\n")


def test_a_config_mistake_in_a_program_is_one_line(tmp_path):
    done = run_program('''
        import fibercore
        fibercore.init(start_timout=5)
    ''', tmp_path)
    assert done.returncode == 1
    assert done.stderr == ("fibercore: unknown fibercore config key 'start_timout' in "
                           "fibercore.init(start_timout=...): "
                           "did you mean 'start_timeout'? (FIBER_DEBUG=1 shows the traceback)\n")


def test_a_misspelled_variable_is_said_once_not_by_every_job(tmp_path):
    done = run_program(POOL_APP, tmp_path, env={**LOCAL, "FIBER_POOL_PROCESES": "2"})
    assert done.returncode == 0, done.stderr
    assert done.stderr == "fibercore: ignoring FIBER_POOL_PROCESES (no such key): did you mean FIBER_POOL_PROCESSES?\n"


def test_a_misspelled_fiberconfig_section_is_one_line(tmp_path):
    (tmp_path / ".fiberconfig").write_text("[defualt]\npool_processes = 2\n")
    done = run_program(POOL_APP, tmp_path)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"fibercore: {tmp_path / '.fiberconfig'}: unknown section [defualt]; fibercore reads the [default] "
        "section only (as the original fiber): rename it to [default] (FIBER_DEBUG=1 shows the traceback)"]


@pytest.mark.parametrize("args, message", [
    (["run", "--backend", "locl", "--", "python", "app.py"], "did you mean 'local'?"),
    (["doctor", "--backend", "nosuch"], "unknown fibercore backend 'nosuch'"),
    (["run", "--", "nosuchprogram"], "no program 'nosuchprogram' to run on 'local': give the command"),
])
def test_cli_mistakes_are_one_line_and_exit_code_2(tmp_path, args, message):
    (tmp_path / "app.py").write_text("print('hi')\n")
    done = fiber(*args, cwd=tmp_path, env=LOCAL)
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("fiber run: session")]
    assert len(lines) == 1 and message in lines[0], done.stderr


def test_fiber_run_of_a_script_without_python_runs_it(tmp_path):
    (tmp_path / "app.py").write_text("import sys\nprint('ran', sys.argv[1:])\nsys.exit(3)\n")
    done = fiber("run", "app.py", "x", cwd=tmp_path, env=LOCAL)
    assert done.returncode == 3 and "ran ['x']" in done.stdout, done.stderr


def test_doctor_checks_the_selected_backend_first_and_each_backend_once(tmp_path):
    done = fiber("doctor", cwd=tmp_path, env=LOCAL, timeout=300)
    headings = [line for line in done.stdout.splitlines() if line and not line.startswith(" ")
                and line.endswith(":") or line.endswith(": the selected backend:")]
    assert headings[0] == "local: the selected backend:", done.stdout
    names = [h.split(":")[0].split(" (")[0] for h in headings]
    assert len(names) == len(set(names)), done.stdout
    # an installed backend's other name is its alias, not a second check
    if "kubernetes" in names:
        assert "kubernetes (k8s):" in done.stdout and "k8s" not in names
    # the selected backend is healthy here: the others' problems do not fail the command
    assert done.returncode == 0, done.stdout


def test_idle_workers_leave_quietly_on_the_terminals_ctrl_c(tmp_path):
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent('''
        import faulthandler, signal, time
        import fibercore as mp

        def square(x):
            return x * x

        if __name__ == "__main__":
            faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test's report if it hangs
            with mp.Pool(2) as pool:
                print(pool.map(square, range(4)), flush=True)
                time.sleep(120)
    '''))
    # Its own process group, as a terminal gives a command: Ctrl-C signals the whole group. And
    # SIGINT handled as a terminal's shell leaves it: a test run started in the background by a
    # non-interactive shell inherits SIGINT ignored, and so would the program (CI hung on that).
    proc = subprocess.Popen([sys.executable, str(app)], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env={**os.environ, **LOCAL},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "[0, 1, 4, 9]"
    time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:  # say where it is stuck: its processes and its threads' stacks
        group = subprocess.run(["ps", "-o", "pid,stat,wchan:24,etime,args", "-g", str(proc.pid)],
                               capture_output=True, text=True).stdout
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(2)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        raise AssertionError(f"the program did not end within 60 s of Ctrl-C\n{group}\n{err}") from None
    assert proc.returncode != 0
    # the master's own KeyboardInterrupt, as with multiprocessing; nothing from the workers
    assert err.count("Traceback") == 1 and err.rstrip().endswith("KeyboardInterrupt"), err
    assert "Worker" not in err and "fibercore/" not in err, err


def test_scripts_run_runs_a_program_from_the_callers_directory(tmp_path):
    (tmp_path / "mine.py").write_text("import os\nprint('cwd', os.getcwd())\n")
    env = {**os.environ, "FIBER_VENV": sys.prefix}
    done = subprocess.run([str(ROOT / "scripts" / "run"), "mine.py"], cwd=tmp_path, capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"cwd {tmp_path}" in done.stdout
    missing = subprocess.run([str(ROOT / "scripts" / "run"), "nothere.py"], cwd=tmp_path, capture_output=True,
                             text=True, env=env, timeout=120)
    assert missing.returncode == 2
    assert missing.stderr == (f"scripts/run: no file 'nothere.py' in {tmp_path}: give the program's path from "
                              "here (scripts/run path/to/app.py)\n")


def test_the_readme_says_the_project_is_not_on_a_package_index():
    readme = (ROOT / "README.md").read_text()
    assert "not on a package index yet" in readme
    assert "scripts/wheels" in readme and "--find-links dist/" in readme
    assert re.search(r"^pip install fibercore fiber-k8s --find-links dist/", readme, re.M)


def test_the_readme_says_what_scripts_test_installs_and_starts_and_how_to_run_without_it():
    """Every package scripts/test may apt-install, and that it starts a dockerd and builds
    Kubernetes, is said beside the two commands; so is the switch that changes nothing on the
    machine, which scripts/test honours for each of those steps."""
    script = (ROOT / "scripts" / "test").read_text()
    readme = (ROOT / "README.md").read_text()
    two_commands = readme.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    packages = set(re.findall(r'missing="\$missing ([a-z0-9.-]+)"', script))
    assert {"docker.io", "slurm-wlm", "chromium"} <= packages
    for package in sorted(packages):
        assert f"`{package}`" in two_commands, f"the README does not say scripts/test installs {package}"
    assert "dockerd" in two_commands and "Kubernetes" in two_commands and "torch" in two_commands
    assert "FIBER_TEST_NO_SYSTEM=1 scripts/test" in two_commands
    guarded = [line for line in script.splitlines()
               if line.startswith("if ") and ("apt-get" in line or "docker info" in line)]
    assert guarded and all('[ -n "$SYSTEM" ]' in line for line in guarded), guarded
