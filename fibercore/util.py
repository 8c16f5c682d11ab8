"""Small helpers the core shares (one definition each)."""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
from collections.abc import Callable
from typing import Any

#: Characters of a job's output quoted in an error (the end of it, where the failure is).
LOG_TAIL = 4000


def truthy_env(name: str) -> bool:
    """Whether environment variable ``name`` is set to something other than 0/false/no/off."""
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def debug_enabled() -> bool:
    """``FIBER_DEBUG=1``: full tracebacks instead of one-line errors."""
    return truthy_env("FIBER_DEBUG")


def setup_error(exc: BaseException) -> BaseException | None:
    """The fibercore configuration or backend-setup error in ``exc``'s chain, if any: an error
    whose message is the whole story (what is wrong, what to do), not a bug's traceback."""
    from fibercore.errors import BackendUnavailableError, ConfigError

    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (BackendUnavailableError, ConfigError)):
            return current
        current = current.__cause__ or current.__context__
    return None


def install_excepthook() -> None:
    """An uncaught configuration or backend-setup error ends the program with one line that
    names the fix (``FIBER_DEBUG=1``: the traceback). Left alone when something else (IPython,
    a debugger) already replaced ``sys.excepthook``."""
    import sys

    if sys.excepthook is not sys.__excepthook__:
        return
    previous = sys.excepthook

    def hook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        if setup_error(value) is None or debug_enabled():
            previous(kind, value, tb)
            return
        text = " ".join(str(value).split())
        sys.stderr.write(f"fibercore: {text} (FIBER_DEBUG=1 shows the traceback)\n")

    sys.excepthook = hook


#: File descriptors a job costs the process that starts it (output pipes, connections).
FDS_PER_JOB = 4


def make_room_for_jobs(n: int, what: str) -> None:
    """Before ``n`` more jobs start here: raise this process's soft limit of open files
    towards the hard one when they would not fit, or say which limit to raise."""
    try:
        import resource
    except ImportError:  # pragma: no cover - not POSIX
        return
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        return
    need = open_now + FDS_PER_JOB * n + 64
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard != resource.RLIM_INFINITY and need > hard:
        from fibercore.errors import ProcessError

        raise ProcessError(
            f"{what} needs about {need:,} open files in this process, and at most {hard:,} are allowed "
            f"(the hard limit, ulimit -Hn): raise it (ulimit -n {need} as root, LimitNOFILE= in a "
            f"systemd unit, docker run --ulimit nofile={need}) or start fewer jobs")
    raised = max(need, 2 * soft)
    if hard != resource.RLIM_INFINITY:
        raised = min(raised, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    logging.getLogger("fibercore").debug("open files limit raised from %d to %d for %s", soft,
                                          resource.getrlimit(resource.RLIMIT_NOFILE)[0], what)


def process_start(pid: int) -> str:
    """Process ``pid``'s start time in clock ticks since boot ("" when it does not run): with
    its pid, who a process is (a pid alone may be reused)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    if len(fields) < 20 or fields[0] == b"Z":
        return ""
    return fields[19].decode()


_machine: list[str] = []


def machine_identity() -> str:
    """Eight hex digits naming this machine *and* network namespace ("" when unknown).

    Two processes with the same value share abstract Unix socket names and ``/dev/shm``
    (a container with its own network namespace gets another value): the boot id and the
    namespace's inode, hashed.
    """
    if not _machine:
        import hashlib

        try:
            with open("/proc/sys/kernel/random/boot_id", "rb") as f:
                boot = f.read().strip()
            netns = os.stat("/proc/self/ns/net").st_ino
            _machine.append(hashlib.sha256(boot + b"/" + str(netns).encode()).hexdigest()[:8])
        except OSError:
            _machine.append("")
    return _machine[0]


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
    from multiprocessing.pool import ExceptionWithTraceback  # type: ignore[attr-defined]

    return ExceptionWithTraceback(exc, exc.__traceback__)


_finalizer_calls: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
_finalizer_thread: dict[int, threading.Thread] = {}  # pid -> thread (a forked child starts its own)
_finalizer_lock = threading.Lock()


def start_finalizer_thread() -> None:
    """Start this process's finalizer thread now (call it where objects that use
    :func:`off_thread` are made, so that a finalizer never has to start it)."""
    pid = os.getpid()
    if pid in _finalizer_thread:
        return
    with _finalizer_lock:
        if pid not in _finalizer_thread:
            thread = threading.Thread(target=_run_finalizer_calls, name="fiber-finalizers", daemon=True)
            thread.start()
            _finalizer_thread[pid] = thread


def off_thread(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` soon on this process's finalizer thread. For finalizers: garbage
    collection runs them inside whatever the current thread holds, where taking a lock (a
    socket's, a service's) again would deadlock. ``SimpleQueue.put`` is reentrant: this never
    blocks."""
    _finalizer_calls.put((fn, args))


def _run_finalizer_calls() -> None:
    while True:
        fn, args = _finalizer_calls.get()
        try:
            fn(*args)
        except Exception:  # a finalizer's failure must not stop the others
            logging.getLogger("fibercore").debug("finalizer %r failed", fn, exc_info=True)
