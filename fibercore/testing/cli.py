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
