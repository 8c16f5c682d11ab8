"""Small helpers the core shares (one definition each)."""

from __future__ import annotations

import os
import signal
from typing import Any

#: Characters of a job's output quoted in an error (the end of it, where the failure is).
LOG_TAIL = 4000


def truthy_env(name: str) -> bool:
    """Whether environment variable ``name`` is set to something other than 0/false/no/off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def exitcode_name(code: int) -> str:
    """``SIGKILL`` for -9 (a signal's name for a negative code), else the number."""
    if code < 0:
        try:
            return signal.Signals(-code).name
        except ValueError:
            pass
    return str(code)


def describe_exit(code: int | None) -> str:
    """How a job ended, for messages: "killed by SIGKILL (exit code -9)", "exit code 1"."""
    if code is None:
        return "exit status unknown"
    name = exitcode_name(code)
    if code < 0 and name != str(code):
        return f"killed by {name} (exit code {code})"
    return f"exit code {code}"


def log_tail(text: str, limit: int = LOG_TAIL) -> str:
    """The end of a job's output for an error message ("(no output)" when there is none)."""
    text = text.strip()
    if not text:
        return "(no output)"
    return text if len(text) <= limit else "...\n" + text[-limit:]


def with_traceback(exc: BaseException) -> Any:
    """``exc`` carrying its formatted traceback to the process that re-raises it (as
    multiprocessing's pool does: the remote traceback becomes the ``__cause__``)."""
    from multiprocessing.pool import ExceptionWithTraceback

    return ExceptionWithTraceback(exc, exc.__traceback__)
