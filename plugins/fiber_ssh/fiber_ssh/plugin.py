"""SSH backend: every Fiber process is a process on one of a list of hosts
(``FIBER_BACKEND=ssh``, hosts from ``ssh_hosts`` or ``ssh_hostfile``).

A job goes to the host with the most free slots; it runs in its own process group, which
terminate/kill signal; its output streams back to the master; a host whose connection is
lost has its jobs reported killed, so a Pool reruns their tasks elsewhere. The session
secret goes to the job over the ssh session's stdin and on through an inherited pipe, never
on a command line. Written on fibercore's public names only, as a third party would.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import threading
from typing import Any

import pluggy

hookimpl = pluggy.HookimplMarker("fiber")

#: The fibercore hook contract these hooks are written for (fibercore.hookspecs).
FIBER_CONTRACT = 2
NAME = "ssh"

#: The engine of each configuration in use: ``fibercore.init(...)`` with other settings gets
#: its own, while jobs keep the engine that started them.
ENGINE_KEYS = ("ssh_hosts", "ssh_hostfile", "ssh_port", "ssh_identity", "ssh_options", "ssh_python",
                "ssh_connect_timeout", "ssh_host_retry", "ssh_multiplex", "ssh_echo_output")
_engines: dict[tuple[Any, ...], Any] = {}
_lock = threading.Lock()
_numbers = itertools.count(1)  # job ids: SESSION.N


def engine(config: Any) -> Any:
    key = tuple(config.get(k) for k in ENGINE_KEYS)
    with _lock:
        eng = _engines.get(key)
        if eng is None:
            from fiber_ssh.engine import Engine

            eng = _engines[key] = Engine(config)
    return eng


@atexit.register
def _at_exit() -> None:
    for eng in list(_engines.values()):
        eng.close()


def _job(job: Any) -> Any:
    return job.data if getattr(job, "backend", None) == NAME else None


@hookimpl
def fiber_config_options() -> list[Any]:
    from fibercore.types import Option

    def opt(name: str, typ: Any, default: Any, text: str) -> Any:
        return Option(name, typ, default, text, plugin="fiber-ssh")

    return [
        opt("ssh_hosts", str, None, "Hosts as `[user@]host[:slots]`, comma-separated (Open MPI's -H); "
            "a host without :slots gets its CPU count."),
        opt("ssh_hostfile", str, None, "A file of hosts, one per line: `[user@]host slots=N port=P python=PATH` (only "
                                       "the host is required)."),
        opt("ssh_port", int, None, "Port of every host's sshd (default: ~/.ssh/config, else 22)."),
        opt("ssh_identity", str, None, "Private key file (ssh -i); default: the agent and ~/.ssh."),
        opt("ssh_options", str, None, "Extra ssh client options, e.g. -o StrictHostKeyChecking=accept-new."),
        opt("ssh_python", str, None, "Interpreter on the hosts (default: this one's path; per host: python= in the "
                                     "hostfile)."),
        opt("ssh_connect_timeout", float, 10.0, "Seconds ssh waits for a host to answer."),
        opt("ssh_host_retry", float, 30.0, "Seconds a host whose connection failed is skipped before it is tried "
                                           "again."),
        opt("ssh_multiplex", bool, True, "Share one connection per host between sessions (OpenSSH ControlMaster)."),
        opt("ssh_echo_output", bool, True, "Echo the jobs' output to the master's stdout/stderr."),
    ]


@hookimpl
def fiber_listen_host(config: Any) -> str:
    """127.0.0.1 when every host is this machine, else the address that routes outward."""
    from fiber_ssh.hosts import hosts_from_config
    from fibercore.backendkit import outward_address

    hosts = hosts_from_config(config.get("ssh_hosts"), config.get("ssh_hostfile"))
    if all(h.address in ("localhost", "127.0.0.1", "::1") for h in hosts):
        return "127.0.0.1"
    return outward_address()


@hookimpl
def fiber_create_job(spec: Any, config: Any) -> Any:
    from fibercore.backendkit import MASTER_LABEL
    from fibercore.types import Job

    if spec.labels.get("fiber-detached") == "true":
        from fibercore.errors import ConfigError

        raise ConfigError("fiber run --detach cannot work on ssh: a job ends with the ssh session of the "
                          "command that started it. Run without --detach inside tmux, screen or nohup")
    eng = engine(config)
    jid = f"{spec.session}.{next(_numbers)}"
    # No cwd (a master from `fiber run`): the creator's, as hosts usually share the file system;
    # the launcher falls back to the home directory where the path does not exist.
    request = {"jid": jid, "name": spec.name, "args": list(spec.args), "env": dict(spec.env),
               "cwd": spec.cwd or os.getcwd(),
               "secret": spec.secret_env.get("FIBER_SECRET", ""), "master": spec.labels.get(MASTER_LABEL, "")}
    slots = max(1, math.ceil(spec.cpu or 1))
    job = eng.submit(jid, spec.name, request, slots, spec.python)
    return Job(jid=jid, backend=NAME, data=job, spec=spec, command=["ssh", "HOST", *spec.argv("python")])


@hookimpl
def fiber_job_status(job: Any) -> Any:
    from fibercore.types import JobStatus

    j = _job(job)
    if j is None:
        return None
    return {"exited": JobStatus.EXITED, "running": JobStatus.RUNNING}.get(j.engine.status(j), JobStatus.PENDING)


@hookimpl
def fiber_wait_job(job: Any, timeout: float | None, config: Any) -> int | None:
    j = _job(job)
    return None if j is None else j.engine.wait(j, timeout)


@hookimpl
def fiber_terminate_job(job: Any, force: bool, config: Any) -> bool | None:
    j = _job(job)
    if j is None:
        return None
    j.engine.signal(j, force)
    return True


@hookimpl
def fiber_job_logs(job: Any, config: Any) -> str | None:
    j = _job(job)
    return None if j is None else j.engine.logs(j)


@hookimpl
def fiber_cleanup_jobs(session: str | None, config: Any) -> int:
    return engine(config).cleanup(session)


@hookimpl
def fiber_list_jobs(session: str | None, config: Any) -> list[Any]:
    return engine(config).list_jobs(session)


@hookimpl
def fiber_read_job_logs(jid: str, config: Any) -> str | None:
    from fibercore.errors import ConfigError

    session, dot, number = jid.partition(".")
    if not (dot and number.isdigit()):
        return None
    for eng in list(_engines.values()):
        j = eng.jobs.get(jid)
        if j is not None:
            return eng.logs(j)
    raise ConfigError(f"the output of ssh job {jid} streams to the terminal of its master (fiber-ssh keeps "
                      "no log files on the hosts); read it there, or redirect the program's output")


@hookimpl
def fiber_doctor(config: Any) -> list[Any]:
    import shutil

    from fiber_ssh.engine import SshError
    from fibercore.types import Check

    if shutil.which("ssh") is None:
        return [Check(NAME, "ssh client", False, "not found", "apt-get install openssh-client")]
    try:
        eng = engine(config)
    except Exception as exc:
        return [Check(NAME, "hosts configured", False, str(exc), "set ssh_hosts or ssh_hostfile")]
    checks = []
    for host in eng.hosts:
        try:
            info = eng.tool(host, {"kind": "info"}, timeout=10)
        except SshError as exc:
            checks.append(Check(NAME, f"{host.name} reachable with keys (BatchMode)", False, str(exc),
                                "check ssh -o BatchMode=yes HOST true works (key, known_hosts, port)"))
            continue
        checks.append(Check(NAME, f"{host.name} runs Python with fibercore", bool(info.get("fibercore")),
                            f"Python {info.get('python')}, fibercore {info.get('fibercore')}, "
                            f"{info.get('cpus')} CPUs, {host.slots} slots",
                            "install fibercore on the host, or set python= for it in ssh_hostfile (or ssh_python)"))
    return checks
