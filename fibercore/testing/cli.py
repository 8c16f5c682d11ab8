"""Run the ``fiber`` command as a user does (a subprocess), for the core's and the backends' tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path


def fiber_command() -> list[str]:
    """The installed ``fiber`` script next to this interpreter, else ``python -m fibercore.cli``."""
    script = Path(sys.executable).parent / "fiber"
    return [str(script)] if script.exists() else [sys.executable, "-m", "fibercore.cli"]


def fiber(*args: str, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``fiber ARGS`` with this environment plus ``env``; returns its exit code and output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*fiber_command(), *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


def interrupt_when(args: list[str], ready: str, *, cwd: str | Path | None = None,
                   env: Mapping[str, str] | None = None, timeout: float = 300) -> tuple[int, str, str]:
    """Start ``fiber ARGS``, press Ctrl-C (SIGINT) once ``ready`` is in its output; (code, out, err)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.Popen([*fiber_command(), *args], cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if ready in line:
            break
        if time.monotonic() > deadline:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, "".join(seen) + out, err


DEMO_APP = '''\
"""A small fibercore program with a local module and a requirement, for fiber run's tests."""
import sys
import time

import fibercore as mp
from mylib.work import square

try:
    import six  # from requirements.txt, when the image installed it
    extra = "six " + six.__version__
except ImportError:
    extra = "no six"

if __name__ == "__main__":
    with mp.Pool(2) as pool:
        print("squares", pool.map(square, range(6)), extra, flush=True)
        if sys.argv[1:] == ["wait"]:
            print("waiting", flush=True)
            pool.map(time.sleep, [600, 600])
    sys.exit(int(sys.argv[1]) if sys.argv[1:] and sys.argv[1].isdigit() else 0)
'''


def write_demo_project(directory: str | Path, requirement: str = "six==1.16.0") -> Path:
    """``app.py`` + ``mylib/`` + ``requirements.txt`` in ``directory``: what `fiber run --build` ships."""
    root = Path(directory)
    (root / "mylib").mkdir(parents=True, exist_ok=True)
    (root / "app.py").write_text(DEMO_APP)
    (root / "mylib" / "__init__.py").write_text("")
    (root / "mylib" / "work.py").write_text("def square(x):\n    return x * x\n")
    (root / "requirements.txt").write_text(requirement + "\n")
    return root


def session_of(stderr: str) -> str:
    """The session id ``fiber run`` reports on its stderr."""
    import re

    found = re.search(r"fiber run: session ([0-9a-f]+)", stderr)
    assert found, f"fiber run reported no session:\n{stderr}"
    return found.group(1)
