"""The template process that forks local jobs (fiber_local.template): what a job forked
from it sees, what it leaves in /proc, and a template that dies."""

from __future__ import annotations

import os
import signal
import time

import pytest

import fibercore as fc
from fibercore.testing.targets import report_environment, sleep_for


def _template_pids() -> list[int]:
    """Template processes of this master (their parent is this process)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as fh:
                comm = fh.read().strip()
            with open(f"/proc/{entry}/stat") as fh:
                state, ppid = fh.read().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError, IndexError):
            continue
        if comm == "fiber-template" and int(ppid) == os.getpid() and state != "Z":
            found.append(int(entry))
    return found


def _parent(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as fh:
        return int(fh.read().rsplit(")", 1)[1].split()[1])


@pytest.fixture(autouse=True)
def _local() -> None:
    if not os.path.isdir("/proc"):
        pytest.skip("the template is Linux only")


def test_a_forked_job_is_its_own_process_with_its_own_name_and_no_secret_anywhere_in_proc():
    q = fc.Queue()
    p = fc.Process(target=report_environment, args=(q,), name="Forked-Job-With-A-Long-Name")
    p.start()
    env = q.get(timeout=60)
    p.join(30)
    assert p.exitcode == 0
    assert env["name"] == "Forked-Job-With-A-Long-Name" and env["secret_in_env"] is False
    sleeper = fc.Process(target=sleep_for, args=(2.0,))
    sleeper.start()
    templates = _template_pids()  # this session's, and those of earlier sessions of this process
    assert _parent(sleeper.pid) in templates and sleeper.pid not in templates
    sleeper.join(30)
    secret = fc.get_runtime().secret.hex().encode()
    for pid in templates:  # the environment block a forked job shares with its template
        with open(f"/proc/{pid}/environ", "rb") as fh:
            assert secret not in fh.read()


def test_a_new_template_retires_the_idle_ones():
    """Another template (here: other preload modules; or a new session) makes the earlier one
    exit once none of its jobs runs: a process and a socket each, not kept until the end."""
    templates = []
    try:
        for preload in ("none", "colorsys"):
            fc.init(local_template_preload=preload)
            p = fc.Process(target=sleep_for, args=(0.5,))
            p.start()
            templates.append(_parent(p.pid))  # while it runs: its template
            p.join(60)
            assert p.exitcode == 0
    finally:
        fc.init()
    assert templates[0] != templates[1]
    deadline = time.monotonic() + 10
    while templates[0] in _template_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert templates[0] not in _template_pids(), "the idle template is left"


def test_jobs_still_start_and_end_when_the_template_is_killed():
    first = fc.Process(target=sleep_for, args=(1.0,))
    first.start()
    template = _parent(first.pid)
    assert template in _template_pids()
    os.kill(template, signal.SIGKILL)
    second = fc.Process(target=sleep_for, args=(0.1,))
    second.start()  # a new template forks it
    second.join(60)
    assert second.exitcode == 0
    first.join(60)  # its template is gone: its end is noticed (the status is lost: -9)
    assert first.exitcode is not None
    deadline = time.monotonic() + 10
    while template in _template_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert template not in _template_pids()


_PRELOAD_MASTER = """
import sys
{imports}
import fibercore as fc

def report(q):
    q.put({module!r} in sys.modules)

if __name__ == "__main__":
    q = fc.Queue()
    p = fc.Process(target=report, args=(q,))
    p.start()
    print("preloaded" if q.get(timeout=60) else "not preloaded", flush=True)
    p.join(30)
"""


def _run_master(tmp_path, preload: str | None, module: str, imports: str = ""):
    """A master whose job reports whether ``module`` was imported when it started."""
    import subprocess
    import sys

    script = tmp_path / "master.py"
    script.write_text(_PRELOAD_MASTER.format(imports=imports, module=module))
    env = {k: v for k, v in os.environ.items() if k != "FIBER_LOCAL_TEMPLATE_PRELOAD"}
    if preload is not None:
        env["FIBER_LOCAL_TEMPLATE_PRELOAD"] = preload
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out


@pytest.mark.parametrize("preload, expected", [("", "not preloaded"),
                                                ("colorsys, no_such_module_here", "preloaded")])
def test_template_preload_imports_modules_before_jobs_fork(tmp_path, preload, expected):
    out = _run_master(tmp_path, preload, "colorsys")
    assert out.stdout.strip() == expected
    if preload:  # a module that cannot be imported is said in one line, and jobs still start
        assert "cannot preload no_such_module_here (ModuleNotFoundError" in out.stderr
        assert "Check local_template_preload" in out.stderr


@pytest.mark.parametrize("preload, expected", [(None, "preloaded"), ("none", "not preloaded")])
def test_template_preloads_numpy_when_the_program_imported_it(tmp_path, preload, expected):
    """The default (auto): a program that imported numpy gets jobs forked with numpy imported
    (the job's target never imports it here); ``none`` turns that off."""
    pytest.importorskip("numpy")
    out = _run_master(tmp_path, preload, "numpy", imports="import numpy")
    assert out.stdout.strip() == expected


_SB3_MASTER = """
import os, sys, time
from stable_baselines3.common.vec_env import SubprocVecEnv
import gymnasium as gym
import fibercore as fc

def make():
    return gym.make("CartPole-v1")

def report(q):
    parent = os.getppid()
    q.put(("torch" in sys.modules, open(f"/proc/{parent}/comm").read().strip(),
           len(os.listdir(f"/proc/{parent}/task"))))

if __name__ == "__main__":
    q = fc.Queue()
    p = fc.Process(target=report, args=(q,))
    p.start()
    print(*q.get(timeout=120), flush=True)
    p.join(30)
    vec = SubprocVecEnv([make] * 8, start_method="fiber")
    print(len(vec.reset()), flush=True)
    vec.close()
"""


def test_a_program_that_imported_stable_baselines3_gets_jobs_forked_with_torch(tmp_path):
    """The default preload (auto) of a program that imported stable-baselines3 (and so torch
    and gymnasium): its jobs start with torch imported, forked from a template that is still
    one thread, and its SubprocVecEnv of 8 envs starts and resets."""
    import subprocess
    import sys

    pytest.importorskip("stable_baselines3")
    (tmp_path / "master.py").write_text(_SB3_MASTER)
    env = {k: v for k, v in os.environ.items() if k != "FIBER_LOCAL_TEMPLATE_PRELOAD"}
    out = subprocess.run([sys.executable, "master.py"], cwd=tmp_path, capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "fiber-template", "1", "8"], out.stdout
