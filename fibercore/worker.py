"""The worker entry point: ``python -m fibercore.worker`` inside every job.

Follows the admin protocol of :mod:`fibercore.admin`: dial the master, HELLO with
the one-time token, receive PREP (authenticated before anything is unpickled),
apply the master's ``sys.path`` and working directory, run the process, report
EXIT. A watchdog thread keeps listening to the master: when the connection closes
or the heartbeat stops, the worker stops its own children and exits, so a dead
master leaves no orphan jobs.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import threading
import time

EXIT_MASTER_GONE = 75
EXIT_BOOTSTRAP_FAILED = 76
#: Seconds a worker lives on after its master's connection closed.
ORPHAN_GRACE = 1.0


def exit_job(message: str | None, code: int) -> None:
    """End this job now with ``code``, saying why on stderr (``None``: quietly, as after a
    Ctrl-C that found it idle); its children are stopped first."""
    try:
        if message is not None:
            sys.stderr.write(f"fibercore worker {os.getpid()}: {message}\n")
        else:  # what the program printed before the Ctrl-C
            sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    try:
        from fibercore import process

        process._terminate_all(force=True)
    except Exception:
        pass
    os._exit(code)


#: The entry ``python -m fibercore.worker`` put first on ``sys.path`` (the job's starting
#: directory), which is the job's, not the program's.
_STARTED_IN = None if getattr(sys.flags, "safe_path", False) else (sys.path[0] if sys.path else None)


def job_sys_path(master: list[str], own: list[str], started_in: str | None) -> list[str]:
    """The master's ``sys.path``, in its order, then what only this job's interpreter has
    (its own site-packages in a container), without the entry ``-m`` added for the job's
    starting directory: a job imports what its master imports, as a multiprocessing child."""
    known = set(master)
    return list(master) + [p for p in own if p not in known and p != started_in]


def _pid1_sigterm() -> None:
    """As PID 1 of a container without an init, a signal with the default action is
    ignored: make SIGTERM end the job as it would anywhere else (status 128+15, which
    backends report as -15), so that graceful pod deletion and `docker stop` work."""
    if os.getpid() != 1:
        return
    import signal

    def on_term(signum: int, frame: object) -> None:
        exit_job("terminated (SIGTERM)", 128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)


def main() -> int:
    _pid1_sigterm()
    address = os.environ.get("FIBER_MASTER_ADDR")
    token = os.environ.pop("FIBER_TOKEN", None)
    if not address or not token:
        sys.stderr.write(
            "fibercore.worker is started by fibercore for a Process; it needs FIBER_MASTER_ADDR "
            "and FIBER_TOKEN from the master. Do not run it by hand.\n"
        )
        return 2

    master_python = os.environ.get("FIBER_MASTER_PYTHON")
    here = "{}.{}".format(*sys.version_info[:2])
    if master_python and master_python != here:
        sys.stderr.write(
            f"fibercore worker: this job runs Python {here} ({sys.executable}) but the master runs "
            f"Python {master_python}; functions pickled by value do not cross minor versions. Use "
            f"a Python {master_python} image or interpreter (image / python_exe).\n"
        )
        return EXIT_BOOTSTRAP_FAILED

    from fibercore import admin, lifetime
    from fibercore.errors import TransportClosed, TransportError, TransportTimeout
    from fibercore.runtime import get_runtime

    rt = get_runtime()
    timeout = float(rt.config.get("start_timeout"))
    channel = rt.dial("router", address, service="admin")
    # The fourth part says this worker answers PING with PONG: the master may then declare
    # it lost when it falls silent (a partitioned or frozen host).
    from fibercore.util import machine_identity

    channel.send([(admin.HELLO, [token.encode(), str(os.getpid()).encode(), socket.gethostname().encode(),
                                 admin.ANSWERS_PING + b" " + machine_identity().encode()])])
    deadline = time.monotonic() + timeout
    prep_parts = None
    while prep_parts is None:
        try:
            messages, _ = channel.recv(timeout=max(0.0, deadline - time.monotonic()))
        except (TransportTimeout, TransportClosed):
            exit_job(f"the master at {address} did not answer within {timeout:.0f} s", EXIT_BOOTSTRAP_FAILED)
            return EXIT_BOOTSTRAP_FAILED
        for op, parts in messages:
            if op == admin.PREP:
                prep_parts = parts
            elif op == admin.ERROR:
                exit_job(f"the master refused this worker: {bytes(parts[0]).decode()}", EXIT_BOOTSTRAP_FAILED)

    prep = pickle.loads(prep_parts[0])  # authenticated: unseal() checked the frame
    sys.path[:] = job_sys_path(prep["sys_path"], sys.path, _STARTED_IN)
    if os.path.isdir(prep["cwd"]):
        os.chdir(prep["cwd"])
    if "argv" in prep:
        sys.argv = list(prep["argv"])

    connected = threading.Event()
    connected.set()
    last_heard = [time.monotonic()]
    hb_timeout = float(rt.config.get("heartbeat_timeout") or 20.0)

    finishing = threading.Event()

    def on_peer(peer: object, added: bool) -> None:
        if not added and not finishing.is_set():
            connected.clear()  # parent_process().is_alive() is False from now on
            # A moment's grace, as a multiprocessing child outlives its parent: code that
            # watches parent_process() may still report; then no orphan is left.
            threading.Timer(ORPHAN_GRACE, exit_job, (f"the connection to the master at {address} "
                                                 "closed; exiting", EXIT_MASTER_GONE)).start()

    channel.on_peer_event(on_peer)

    # On the master's machine the connection is private, and ends the moment the master's
    # process does: no heartbeat to watch, and no wake-up while idle.
    beats = not getattr(getattr(channel.endpoint, "peer", None), "private", False)

    def watchdog() -> None:
        while True:
            try:
                messages, _ = channel.recv(timeout=1.0 if beats else None)
                last_heard[0] = time.monotonic()
                if any(op == admin.PING for op, _ in messages):
                    channel.send([(admin.PONG, [])])  # the master's side of the heartbeat
            except TransportTimeout:
                if time.monotonic() - last_heard[0] > hb_timeout and not finishing.is_set():
                    exit_job(f"no heartbeat from the master at {address} for {hb_timeout:.0f} s", EXIT_MASTER_GONE)
            except TransportClosed:
                return
            except TransportError:  # a PONG that could not go: the master's silence decides
                pass

    threading.Thread(target=watchdog, name="fiber-watchdog", daemon=True).start()

    from fibercore import process as _process

    if "name" in prep:  # objects unpickled with the Process (a barrier's party) know whose they are
        _process.current_process().name = prep["name"]
        import multiprocessing

        multiprocessing.current_process().name = prep["name"]  # logging's %(processName)s
        from fibercore.runtime import setup_job_logging

        setup_job_logging(prep["name"])
    process_obj = rt.serializer.loads(prep_parts[1:])
    parent = _process._ParentProcess(prep["parent_name"], prep["parent_pid"], prep["parent_host"],
                                     connected.is_set)
    import multiprocessing.process

    multiprocessing.process._parent_process = parent  # type: ignore[attr-defined]  # parent_process() too
    rt.plugins.worker_start(rt.config)
    exitcode = process_obj._bootstrap(parent)
    finishing.set()
    lifetime.run_process_end()  # deliver what user code sent through queues and pipes
    try:
        channel.send([(admin.EXIT, [str(exitcode).encode()])])
    except Exception:
        pass
    try:  # user atexit hooks
        import atexit

        atexit._run_exitfuncs()
    except Exception:
        pass
    return exitcode


def run() -> int:
    """Run this job to its end (as ``python -m fibercore.worker``, or forked by a backend's
    template process): its exit code, for ``os._exit``."""
    try:
        code = main()
    except KeyboardInterrupt:  # the terminal's Ctrl-C while starting or ending, not in user code
        exit_job(None, 128 + 2)
    sys.stdout.flush()
    sys.stderr.flush()
    return code


if __name__ == "__main__":
    os._exit(run())
