"""``fiber run`` on the ssh backend: the master is a process on a host, its workers too, its
output comes back to the command, and its exit code is the command's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fibercore.testing import fiber, session_of

APP = """import sys
import fibercore as mp

def square(x):
    return x * x

if __name__ == '__main__':
    with mp.Pool(2) as pool:
        print('squares', pool.map(square, range(6)), flush=True)
    sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
"""


def test_fiber_run_master_on_a_host_streams_output_and_exit_code(ssh_config: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    env = {"FIBER_BACKEND": "ssh", "FIBER_LISTEN_HOST": "127.0.0.1",
           **{f"FIBER_{key.upper()}": str(value) for key, value in ssh_config.items()}}
    done = fiber("run", "--", "python", "app.py", "4", cwd=tmp_path, env=env)
    assert done.returncode == 4, done.stderr
    assert "squares [0, 1, 4, 9, 16, 25]" in done.stdout
    session = session_of(done.stderr)
    assert "no fiber jobs" in fiber("ps", "--session", session, env=env).stdout  # nothing left running
    doctor = fiber("doctor", "--backend", "ssh", env=env)
    assert doctor.returncode == 0 and "runs Python with fibercore" in doctor.stdout, doctor.stdout


def test_detach_is_refused_with_the_alternative(ssh_config: dict[str, Any], tmp_path: Path) -> None:
    (tmp_path / "app.py").write_text(APP)
    env = {"FIBER_BACKEND": "ssh", "FIBER_LISTEN_HOST": "127.0.0.1",
           **{f"FIBER_{key.upper()}": str(value) for key, value in ssh_config.items()}}
    done = fiber("run", "--detach", "--", "python", "app.py", cwd=tmp_path, env=env)
    assert done.returncode == 2 and "--detach cannot work on ssh" in done.stderr and "tmux" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # one line, no traceback
