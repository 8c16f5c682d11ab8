"""The master's directory of ssh control sockets (``<tmp>/fssh-<random>``, its owner written
in it): gone with the master however it ended (a killed master's is swept by the next one),
closed to another local user; another user's look-alike, a live master's (also one in
another pid namespace, to which the pid means nothing) are never touched."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fiber_ssh.engine import CONTROL_PREFIX, OWNER_FILE, process_identity, sweep_control_dirs

import fibercore as fc
from fibercore.testing.targets import sleep_for

MASTER = """import sys
import fibercore as mp
from fibercore.testing.targets import sleep_for

if __name__ == "__main__":
    job = mp.Process(target=sleep_for, args=(600,), daemon=True)
    job.start()
    print("started", flush=True)
    sys.stdin.read()
"""


def _dead_pid() -> int:
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def _env(ssh_config: dict[str, Any]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBER_")}
    env.update({"FIBER_BACKEND": "ssh", "FIBER_LISTEN_HOST": "127.0.0.1",
                **{f"FIBER_{key.upper()}": str(value) for key, value in ssh_config.items()}})
    return env


def _mine(pid: int) -> list[str]:
    """The control directories whose owner file names ``pid``."""
    found = []
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{CONTROL_PREFIX}*")):
        try:
            owner = Path(path, OWNER_FILE).read_text().split()
        except OSError:
            continue
        if len(owner) == 4 and owner[2] == str(pid):
            found.append(path)
    return found


def _master(tmp_path: Path, ssh_config: dict[str, Any]) -> subprocess.Popen[str]:
    """A master in a process of its own, once its job runs (stdin closed: it exits)."""
    (tmp_path / "master.py").write_text(MASTER)
    master = subprocess.Popen([sys.executable, "master.py"], cwd=tmp_path, env=_env(ssh_config),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert master.stdout is not None
    assert master.stdout.readline() == "started\n"
    return master


def test_a_killed_masters_control_dir_goes_with_the_next_master(ssh_config: dict[str, Any],
                                                                tmp_path: Path) -> None:
    """SIGKILL never runs the master's close: its directory stayed in /tmp for good (a
    newcomer found them after `timeout` ended a run). The next master sweeps it, and removes
    its own when it exits."""
    killed = _master(tmp_path, ssh_config)
    try:
        left = _mine(killed.pid)
        assert len(left) == 1 and os.stat(left[0]).st_mode & 0o777 == 0o700, left
    finally:
        killed.kill()
        killed.wait()
    assert _mine(killed.pid) == left  # nothing of it ran
    following = _master(tmp_path, ssh_config)
    try:
        assert _mine(killed.pid) == []
        assert len(_mine(following.pid)) == 1
    finally:
        assert following.stdin is not None
        following.stdin.close()  # it exits, its daemon job terminated
        assert following.wait(60) == 0
    assert _mine(following.pid) == []


def _control_dir(tmp: Path, name: str, owner: str | None) -> Path:
    path = tmp / f"{CONTROL_PREFIX}{name}"
    path.mkdir(mode=0o700)
    if owner is not None:
        (path / OWNER_FILE).write_text(owner)
    return path


def test_the_sweep_takes_only_this_users_dirs_of_ended_masters(tmp_path: Path) -> None:
    here = process_identity(os.getpid())
    boot, namespace, pid, start = here.split()
    dead = _dead_pid()
    gone = _control_dir(tmp_path, "a", f"{boot} {namespace} {dead} {start}")
    left_socket = socket.socket(socket.AF_UNIX)
    left_socket.bind(str(gone / "0123abcd"))  # what a killed ssh control master leaves
    left_socket.close()
    reused = _control_dir(tmp_path, "b", f"{boot} {namespace} {pid} 1")  # this pid, another start
    running = _control_dir(tmp_path, "c", here)
    elsewhere = _control_dir(tmp_path, "d", f"{boot} 1 {dead} {start}")  # another pid namespace
    other_machine = _control_dir(tmp_path, "e", f"another-boot {namespace} {dead} {start}")
    old = _control_dir(tmp_path, "f", None)  # an older fibercore's: no owner file
    link = tmp_path / f"{CONTROL_PREFIX}g"
    link.symlink_to(running)
    plain = tmp_path / f"{CONTROL_PREFIX}h"
    plain.write_text(f"{boot} {namespace} {dead} {start}")
    assert sorted(sweep_control_dirs(str(tmp_path))) == sorted([str(gone), str(reused)])
    assert not gone.exists() and not reused.exists()
    for stays in (running, elsewhere, other_machine, old):
        assert stays.is_dir(), stays
    assert link.is_symlink() and plain.is_file()


def _attack(control_dir: str, tmp: str, dead: int) -> dict[str, Any]:
    """As the second user: list and connect to the master's control sockets; leave a
    look-alike directory of a dead master for the master's sweep."""
    out: dict[str, Any] = {}
    try:
        out["list"] = os.listdir(control_dir)
    except OSError as exc:
        out["list"] = f"refused: {exc.strerror}"
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.connect(os.path.join(control_dir, "x"))
        out["connect"] = "connected"
    except OSError as exc:
        out["connect"] = f"refused: {exc.strerror}"
    finally:
        sock.close()
    mine = os.path.join(tmp, f"{CONTROL_PREFIX}attacker-{os.getpid()}")
    os.mkdir(mine, 0o700)
    Path(mine, "bait").write_text("the attacker's")
    Path(mine, OWNER_FILE).write_text(process_identity(os.getpid()).rsplit(" ", 2)[0] + f" {dead} 1")
    out["made"] = mine
    return out


def test_another_local_user_cannot_reach_the_control_sockets_or_have_its_dirs_swept(
        ssh_config: dict[str, Any]) -> None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating a second local user needs root and useradd")
    from tests.attacker import LocalUser

    fc.init(backend="ssh", **ssh_config)
    user = LocalUser()
    made = None
    job = fc.Process(target=sleep_for, args=(600,), daemon=True)
    try:
        job.start()  # the shared connection's socket is in the directory now
        control_dir = job._popen.job.data.engine.control_dir
        assert control_dir and os.listdir(control_dir), "no control socket to attack"
        got = user.run(_attack, control_dir, tempfile.gettempdir(), _dead_pid())
        made = got["made"]
        assert got["list"].startswith("refused: Permission denied"), got
        assert got["connect"].startswith("refused: Permission denied"), got
        assert made not in sweep_control_dirs() and Path(made, "bait").read_text() == "the attacker's"
    finally:
        if job._popen is not None:
            job.kill()
            job.join(30)
        fc.init()
        user.remove()
        if made:
            shutil.rmtree(made, ignore_errors=True)


def test_without_proc_the_directory_is_made_with_no_owner_and_never_swept(monkeypatch: Any) -> None:
    """A master where /proc cannot say who it is (macOS, a pid namespace without its own
    /proc) still gets its directory (Engine() failed there); with no owner it is never swept."""
    from fiber_ssh import engine

    def no_proc(pid: int) -> str:
        raise FileNotFoundError("/proc")

    monkeypatch.setattr(engine, "process_identity", no_proc)
    path = engine.make_control_dir()
    try:
        assert os.listdir(path) == []
        monkeypatch.undo()
        assert path not in sweep_control_dirs()
    finally:
        os.rmdir(path)
