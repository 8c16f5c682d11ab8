"""Job-backed ``Process`` with the ``multiprocessing.Process`` API.

A Process is a job on the selected backend: ``start()`` hands it to
:class:`~fibercore.popen_job.JobPopen`, which asks the backend for a job and waits
until the job's worker has connected back. Everything else (join, terminate, kill,
is_alive, exitcode, sentinel) goes through the same Popen seam, as in CPython.
"""

from __future__ import annotations

import atexit
import itertools
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from fibercore.errors import ProcessError
from fibercore.observe import registry
from fibercore.util import exitcode_name

_counter = itertools.count(1)
_children: set[Process] = set()
_children_lock = threading.Lock()


class Process:
    """A process that runs ``target(*args, **kwargs)`` as a job on the selected backend."""

    def __init__(
        self,
        group: None = None,
        target: Callable[..., Any] | None = None,
        name: str | None = None,
        args: Iterable[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        *,
        daemon: bool | None = None,
    ) -> None:
        if group is not None:
            raise ValueError("group argument must be None for now (as in multiprocessing)")
        parent = current_process()
        count = next(_counter)
        self._identity = tuple(getattr(parent, "_identity", ())) + (count,)
        self._parent_pid = os.getpid()
        self._parent_name = parent.name
        self._popen: Any = None
        self._closed = False
        self._target = target
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        self._name = name or type(self).__name__ + "-" + ":".join(str(i) for i in self._identity)
        self._daemonic = parent.daemon if daemon is None else bool(daemon)
        self._authkey = parent.authkey
        #: Resources the job asks its backend for (cpu, memory, gpu); None: those of
        #: ``@fibercore.meta`` on the target (or ``run``), else the backend's defaults.
        self.resources: dict[str, Any] | None = None

    # -- what runs in the job --------------------------------------------------------
    def run(self) -> None:
        """Method to be run in the job; override it in a subclass, as with multiprocessing."""
        if self._target is not None:
            self._target(*self._args, **self._kwargs)

    # -- lifecycle --------------------------------------------------------------------
    def start(self) -> None:
        """Start the job and wait until it has connected back (``start_timeout``)."""
        self.launch()
        self.wait_started()

    def launch(self) -> None:
        """Hand the job to the backend and return without waiting for it to connect;
        :meth:`wait_started` waits. Starting many jobs this way overlaps their start-up
        (a Pool's workers, a Ring's members)."""
        from fibercore.popen_job import JobPopen

        self._check_closed()
        if self._popen is not None:
            raise AssertionError("cannot start a process twice")
        if self._parent_pid != os.getpid():
            raise AssertionError("can only start a process object created by current process")
        if _current_process.daemon:
            raise AssertionError("daemonic processes are not allowed to have children")
        _cleanup()
        _install_exit_handlers()
        self._popen = JobPopen(self)
        # As multiprocessing (bpo-30775): the job has its own copy; keeping the target
        # here would keep alive whatever it refers to, maybe this process object.
        del self._target, self._args, self._kwargs
        with _children_lock:
            _children.add(self)

    def wait_started(self, timeout: float | None = None) -> None:
        """Wait until a launched job has connected back (``start_timeout`` by default);
        raise :class:`~fibercore.errors.JobStartError` (with the job's logs) if it does not."""
        self._check_closed()
        if self._popen is None:
            raise AssertionError("wait_started() needs launch() first")
        try:
            self._popen.wait_started(timeout)
        except BaseException:
            with _children_lock:
                _children.discard(self)
            raise

    @property
    def launched(self) -> bool:
        """Whether :meth:`launch` (or :meth:`start`) handed the job to the backend."""
        return self._popen is not None

    def start_error(self, what: str) -> BaseException:
        """The error to raise for a launched job that never connected: ``what`` happened,
        the job, its status and its logs."""
        if self._popen is None:
            return AssertionError(f"{self.name} was never launched")
        return self._popen.start_error(what, self.job_status())

    def terminate(self) -> None:
        """Stop the job (SIGTERM for local jobs); the exit code becomes negative."""
        self._check_closed()
        if self._popen is not None:
            self._popen.terminate()

    def kill(self) -> None:
        """Stop the job at once (SIGKILL for local jobs)."""
        self._check_closed()
        if self._popen is not None:
            self._popen.kill()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the job ends, or ``timeout`` seconds."""
        self._check_closed()
        if self._parent_pid != os.getpid():
            raise AssertionError("can only join a child process")
        if self._popen is None:
            raise AssertionError("can only join a started process")
        if self._popen.wait(timeout) is not None:
            with _children_lock:
                _children.discard(self)

    def is_alive(self) -> bool:
        self._check_closed()
        if self is _current_process:
            return True
        if self._popen is None or self._parent_pid != os.getpid():
            return False
        if self._popen.poll() is None:
            return True
        with _children_lock:
            _children.discard(self)
        return False

    def close(self) -> None:
        """Release the Process's resources; raises ValueError if it is still running."""
        if self._popen is not None:
            if self._popen.poll() is None:
                raise ValueError("Cannot close a process while it is still running. "
                                 "You should first call join() or terminate().")
            self._popen.close()
            self._popen = None
        with _children_lock:
            _children.discard(self)
        self._closed = True

    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError("process object is closed")

    # -- attributes ---------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError("name must be a string")
        self._name = name

    @property
    def daemon(self) -> bool:
        return self._daemonic

    @daemon.setter
    def daemon(self, daemonic: bool) -> None:
        if self._popen is not None:
            raise AssertionError("process has already started")
        self._daemonic = bool(daemonic)

    @property
    def authkey(self) -> bytes:
        return self._authkey

    @authkey.setter
    def authkey(self, authkey: bytes) -> None:
        self._authkey = bytes(authkey)

    @property
    def exitcode(self) -> int | None:
        self._check_closed()
        if self._popen is None:
            return None
        return self._popen.poll()

    @property
    def ident(self) -> int | None:
        self._check_closed()
        if self is _current_process:
            return os.getpid()
        return self._popen and self._popen.pid

    pid = ident

    @property
    def sentinel(self) -> int:
        """A file descriptor readable once the job has ended (``multiprocessing.connection.wait``)."""
        self._check_closed()
        if self._popen is None:
            raise ValueError("process not started")
        return self._popen.sentinel

    @property
    def job(self) -> Any:
        """The backend's :class:`~fibercore.types.Job` handle (None before start)."""
        return self._popen.job if self._popen is not None else None

    def job_status(self) -> Any:
        """The job's :class:`~fibercore.types.JobStatus` as its backend reports it (None
        before launch): PENDING while a cluster schedules it, RUNNING, EXITED, UNKNOWN."""
        if self._popen is None:
            return None
        from fibercore.runtime import get_runtime

        return get_runtime().plugins.job_status(self._popen.job)

    def logs(self) -> str:
        """What the job printed, as far as the backend can tell."""
        if self._popen is None:
            return ""
        from fibercore.runtime import get_runtime

        return get_runtime().plugins.job_logs(self._popen.job)

    def __repr__(self) -> str:
        code = None
        if self is _current_process:
            status = "started"
        elif self._closed:
            status = "closed"
        elif self._parent_pid != os.getpid():
            status = "unknown"
        elif self._popen is None:
            status = "initial"
        else:
            code = self._popen.poll()
            status = "stopped" if code is not None else "started"
        info = [type(self).__name__, f"name={self._name!r}"]
        if self._popen is not None:
            info.append(f"pid={self._popen.pid}")
        info.append(f"parent={self._parent_pid}")
        info.append(status)
        if code is not None:
            info.append(f"exitcode={exitcode_name(code)}")
        if self.daemon:
            info.append("daemon")
        return "<{}>".format(" ".join(info))

    # -- pickling (the process object travels to its job) ---------------------------------
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_popen"] = None
        state.pop("_authkey", None)  # the worker takes the session secret, never a pickled key
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    # -- in the worker ----------------------------------------------------------------------
    def _bootstrap(self, parent: _ParentProcess | None = None) -> int:
        """Run in the job: become the current process, run, and return the exit code."""
        global _current_process, _parent_process
        from fibercore.runtime import get_runtime

        self._authkey = get_runtime().secret
        _current_process = self
        _parent_process = parent
        with _children_lock:
            _children.clear()
        try:
            self.run()
            exitcode = 0
        except SystemExit as exc:
            if exc.code is None:
                exitcode = 0
            elif isinstance(exc.code, int):
                exitcode = exc.code
            else:
                sys.stderr.write(str(exc.code) + "\n")
                exitcode = 1
        except BaseException:
            exitcode = 1
            import traceback

            sys.stderr.write(f"Process {self.name}:\n")
            traceback.print_exc()
        finally:
            _exit_function()
            # As multiprocessing's children: wait for the target's non-daemonic threads.
            threading._shutdown()  # type: ignore[attr-defined]
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
        return exitcode


class _MainProcess(Process):
    """The master process itself (``current_process()`` outside any job)."""

    def __init__(self) -> None:
        import secrets

        self._identity = ()
        self._name = "MainProcess"
        self._parent_pid = None  # type: ignore[assignment]
        self._popen = None
        self._closed = False
        self._daemonic = False
        self._target = None
        self._args = ()
        self._kwargs = {}
        self._authkey = secrets.token_bytes(32)

    @property
    def authkey(self) -> bytes:
        try:
            from fibercore.runtime import get_runtime

            return get_runtime().secret
        except Exception:  # pragma: no cover - config broken; mp semantics still hold
            return self._authkey

    @authkey.setter
    def authkey(self, authkey: bytes) -> None:
        self._authkey = bytes(authkey)

    def close(self) -> None:
        pass


class _ParentProcess:
    """What a worker knows of the process that started it (``parent_process()``)."""

    def __init__(self, name: str, pid: int, host: str, alive: Callable[[], bool]) -> None:
        self.name = name
        self.pid = self.ident = pid
        self.host = host
        self._alive = alive
        self.daemon = False

    def is_alive(self) -> bool:
        return self._alive()

    def join(self, timeout: float | None = None) -> None:
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while self.is_alive() and (deadline is None or time.monotonic() < deadline):
            time.sleep(0.05)

    def __repr__(self) -> str:
        return f"<_ParentProcess name={self.name!r} parent={self.pid} host={self.host!r}>"


_current_process: Process = _MainProcess()
_parent_process: _ParentProcess | None = None


def current_process() -> Process:
    """The Process object of the caller (the master's is named ``MainProcess``)."""
    return _current_process


def parent_process() -> _ParentProcess | None:
    """The parent of a job-backed process; None in the master."""
    return _parent_process


def _cleanup() -> None:
    with _children_lock:
        children = list(_children)
    for p in children:
        if p._popen is not None and p._popen.poll() is not None:
            with _children_lock:
                _children.discard(p)


def active_children() -> list[Process]:
    """Children started by this process that are still running (a pool or manager dropped
    without closing it is stopped first, as multiprocessing's finalizers do on collection)."""
    from fibercore import lifetime

    lifetime.run_collected()
    _cleanup()
    with _children_lock:
        return list(_children)


# -- exit handling ------------------------------------------------------------------------
_exit_installed = False


def _exit_function() -> None:
    """As multiprocessing does at exit: clean up forgotten pools and managers, terminate
    daemonic children, join the others."""
    from fibercore import lifetime

    lifetime.run_at_exit()
    for p in active_children():
        if p.daemon:
            try:
                p.terminate()
            except Exception:
                pass
    for p in active_children():
        try:
            p.join()
        except Exception:
            pass


def _terminate_all(force: bool = True, connected_too: bool = True) -> None:
    """Stop this process's jobs; with ``connected_too=False`` only those whose worker never
    connected (a pending pod would wait forever): the others stop by themselves once this
    process's connection closes (after a grace second, see fibercore.worker)."""
    with _children_lock:
        children = list(_children)
    for p in children:
        try:
            popen = p._popen
            if popen is None or (not connected_too and popen.connected):
                continue
            popen.kill() if force else popen.terminate()
        except Exception:
            pass


def _install_exit_handlers() -> None:
    """At exit, stop this process's jobs; on SIGTERM too (if nobody else handles it)."""
    global _exit_installed, _sigterm_installer
    if _exit_installed:
        return
    _exit_installed = True
    atexit.register(_exit_function)
    if threading.current_thread() is threading.main_thread():
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                _sigterm_installer = os.getpid()
                signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError):  # pragma: no cover - not the main interpreter
            pass


_sigterm_installer = 0


def _on_sigterm(signum: int, frame: Any) -> None:
    """The master stops every job at once, then dies of SIGTERM as it would have.

    A job's own children outlive it briefly, as multiprocessing's do (parent_process() turns
    not alive), then leave by themselves: no orphan either way. A forked child drops this
    handler (_sigterm_default_in_child); should it run there anyway, the child just ends (its
    copy of our state may hold locks taken at the fork: touching it could hang)."""
    if os.getpid() == _sigterm_installer:
        from fibercore.runtime import get_runtime

        _terminate_all(force=True, connected_too=not get_runtime().is_worker)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


#: The signal mask of each thread forking now, before SIGTERM was held for the fork.
_mask_before_fork: dict[int, Any] = {}


def _hold_sigterm_for_fork() -> None:
    """Before a fork: SIGTERM waits (blocked in the forking thread, so in the child too) until
    the child has dropped our handler. Caught by our handler in the child before CPython's
    after-fork work, it would be lost: that work clears the handlers' pending flags (so a
    signal is not handled twice), and the child, SIGTERM'd by ``Pool.terminate()`` before it
    first ran on a busy machine, lives on and ``join()`` waits for it forever."""
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        _mask_before_fork[threading.get_ident()] = signal.pthread_sigmask(
            signal.SIG_BLOCK, {signal.SIGTERM})


def _release_sigterm_in_parent() -> None:
    mask = _mask_before_fork.pop(threading.get_ident(), None)
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _sigterm_default_in_child() -> None:
    """A forked child (a multiprocessing fork worker) has none of our jobs: SIGTERM ends it
    at once, as without fibercore. A Python-level handler would not be safe there: CPython
    runs it only between bytecodes, and a SIGTERM that lands just before a blocking wait
    (``Pool.terminate()`` signalling a worker on its way into ``SemLock.acquire``) is never
    acted on, so the child, and the ``join()`` after it, hang. A SIGTERM that came since the
    fork was held (:func:`_hold_sigterm_for_fork`): it ends the child when the mask is back."""
    mask = _mask_before_fork.pop(threading.get_ident(), None)
    _mask_before_fork.clear()
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        except ValueError:  # pragma: no cover - forked from a thread of a sub-interpreter
            pass
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


# SIGTERM stays held in the child through the fork hooks run before this one (in the master,
# fibercore.process registers first of fibercore's modules: only the stdlib's run earlier).
os.register_at_fork(before=_hold_sigterm_for_fork, after_in_parent=_release_sigterm_in_parent,
                    after_in_child=_sigterm_default_in_child)


__all__ = [
    "Process",
    "ProcessError",
    "active_children",
    "current_process",
    "parent_process",
]


def _started() -> list[registry.Started]:
    """The started Processes, for ``fiber top`` and the dashboard (:mod:`fibercore.observe.registry`)."""
    with _children_lock:
        found = list(_children)
    return [registry.Started(p.name, getattr(p._popen, "job", None), getattr(p._popen, "returncode", None))
            for p in found]


registry.provide("jobs", _started)
