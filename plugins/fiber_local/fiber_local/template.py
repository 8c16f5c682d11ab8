"""The template process: one pre-imported interpreter per master that forks its local jobs.

``python -m fiber_local.template FD [MODULES]`` imports fibercore's worker side once (and
the comma-separated MODULES of ``local_template_preload``), then serves
the master over the Unix socket FD (a ``SOCK_SEQPACKET`` pair the master made): each
request is one job to start. The template forks; the child takes the job's environment,
working directory, output pipes and secret (sent over the socket, never through the
environment) and runs ``fibercore.worker`` as a ``python -m fibercore.worker`` job would.
The template reports each child's pid, then its exit status when it ends.

Why: a forked job starts in milliseconds instead of an interpreter's start-up, holds the
pre-imported modules in pages it shares with its siblings, and runs faster where jobs
outnumber cores: on a 2-core VM, eight stepped simulators forked from a warm process ran
their steps 2x faster than eight fresh interpreters (multiprocessing's forkserver against
its spawn shows the same).

Isolation is as with a fresh interpreter: the template starts no thread before it forks,
holds nothing of the program (no ``__main__``, no objects of the master), and exits when the
master's end of the socket closes (a master killed with SIGKILL included), while its jobs
exit through their own watchdog on the master's connection.

Messages (pickles, master and template only; the socket pair is private to them):
master -> template ``{"id", "env", "cwd", "secret", "name"}`` with the job's stdout and
stderr write ends as SCM_RIGHTS descriptors; template -> master ``("started", id, pid)``,
``("failed", id, message)``, ``("exit", pid, returncode)`` (``returncode`` as Popen's).
"""

from __future__ import annotations

import gc
import os
import pickle
import select
import signal
import socket
import sys
from typing import Any

#: Largest request (a job's environment is its master's, a few KiB to tens of KiB).
MAX_REQUEST = 4 << 20


def _returncode(status: int) -> int:
    """A wait status as Popen's returncode: the exit code, or minus the signal."""
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _send(sock: socket.socket, message: tuple[Any, ...]) -> None:
    try:
        sock.send(pickle.dumps(message))
    except OSError:  # the master is gone; the loop sees its end close
        pass


def _name(name: str) -> None:
    """Where ``ps``, ``top`` and ``fiber ps`` show it (the kernel keeps 15 bytes)."""
    try:
        with open("/proc/self/comm", "w") as fh:
            fh.write(name[:15])
    except OSError:
        pass


def _run_job(request: dict[str, Any], fds: list[int]) -> int:
    """In the forked child: become the job, run the worker, return its exit code."""
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C reaches user code
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    cwd = request.get("cwd")
    if cwd and os.path.isdir(cwd):
        os.chdir(cwd)
    _name(request["name"])
    from fibercore.backendkit import run_worker

    return run_worker(request["secret"])


def _fork(request: dict[str, Any], fds: list[int], keep_out: list[Any]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 76  # EXIT_BOOTSTRAP_FAILED
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for item in keep_out:  # the template's own descriptors are not the job's
            item.close() if hasattr(item, "close") else os.close(item)
        code = _run_job(request, fds)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(sock: socket.socket) -> None:
    """Start jobs on request and report their ends, until the master's end closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is for the master and jobs
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    open_ = True
    while open_:
        try:
            events = poller.poll()
        except InterruptedError:
            events = []
        for fd, _ in events:
            if fd == wake_r:
                try:
                    os.read(wake_r, 4096)
                except OSError:
                    pass
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_REQUEST, 2)
            except InterruptedError:
                continue
            except OSError:
                data, fds = b"", []
            if not data:
                open_ = False
                break
            request = pickle.loads(data)
            try:
                if len(fds) != 2:
                    raise OSError(f"expected the job's 2 output descriptors, got {len(fds)}")
                pid = _fork(request, fds, [sock, wake_r, wake_w])
            except OSError as exc:
                _send(sock, ("failed", request["id"], f"cannot fork a local job: {exc}"))
            else:
                _send(sock, ("started", request["id"], pid))
            finally:
                for fd in fds:
                    os.close(fd)
        while True:  # report every job that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            _send(sock, ("exit", pid, _returncode(status)))


def _preload(names: str) -> None:
    """Import the user's ``local_template_preload`` modules; one that fails is said and skipped
    (each job then imports it itself, and meets the error where the program uses it)."""
    import importlib

    for name in filter(None, names.split(",")):
        try:
            importlib.import_module(name)
        except Exception as exc:
            sys.stderr.write(f"fiber-local template: cannot preload {name} ({type(exc).__name__}: {exc}); "
                             "jobs import it themselves. Check local_template_preload (its default, auto, preloads "
                             "numpy, torch, gymnasium and stable_baselines3 when the program imported them; none "
                             "turns preloading off).\n")


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    from fiber_local.forking import TEMPLATE_COMM

    _name(TEMPLATE_COMM)
    from fibercore.backendkit import preload_worker

    preload_worker()
    _preload(sys.argv[2] if len(sys.argv) > 2 else "")
    # Everything imported so far lives as long as the jobs: out of the collector's sight, a
    # job's collections never write to (and so copy) the pages it shares with the template.
    gc.freeze()
    sock.send(pickle.dumps(("ready", os.getpid())))
    serve(sock)


if __name__ == "__main__":
    main()
