"""The local backend's engine: each job is a process on this machine, forked by the master's
template process (:mod:`fiber_local.forking`, :mod:`fiber_local.template`: a pre-imported
interpreter, as multiprocessing's forkserver) or, where that cannot be, started with
``subprocess.Popen``.

Output: a single pump thread reads every job's stdout and stderr, echoes them to
the master's (so ``print`` in a worker shows up as with multiprocessing) and keeps
the last 64 KiB per job for the job's logs and start-up errors.

The session secret reaches a job through an inherited pipe (or the template's socket),
never through its environment. What it ignores: ``cpu``, ``memory`` and ``gpu`` limits (a
local process shares the machine); images and volumes.
"""

from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

from fiber_local import owned
from fiber_local.forking import (
    TEMPLATE_COMM,
    TEMPLATE_ENV,
    Forked,
    Template,
    process_alive,
    process_name,
)
from fiber_local.owned import OwnProcess
from fibercore.backendkit import process_usage

if TYPE_CHECKING:
    from fibercore.types import Check, ConfigView, Job, JobInfo, JobSpec, JobStatus, JobUsage

NAME = "local"
#: Set in every local job's environment: the pid of the master that started it.
MASTER_PID_ENV = "FIBERCORE_LOCAL_MASTER_PID"  # not FIBER_*: that prefix is config
#: Set in every local job's environment: its fibercore process name (``fiber ps``).
NAME_ENV = "FIBERCORE_LOCAL_NAME"
_TAIL = 64 * 1024


class _LogPump:
    """One thread that drains every child's output pipes."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.echo = True

    def add(self, fd: int, target_fd: int, tail: bytearray) -> None:
        os.set_blocking(fd, False)
        with self._lock:
            self._sel.register(fd, selectors.EVENT_READ, (target_fd, tail))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fiber-local-logs", daemon=True)
                self._thread.start()
        os.write(self._wake_w, b"x")

    def _run(self) -> None:
        while True:
            for key, _ in self._sel.select():
                if key.data is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                target_fd, tail = key.data
                try:
                    chunk = os.read(key.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    chunk = b""
                if not chunk:
                    with self._lock:
                        self._sel.unregister(key.fd)
                    os.close(key.fd)
                    continue
                tail += chunk
                if len(tail) > _TAIL:
                    del tail[: len(tail) - _TAIL]
                if self.echo:
                    try:
                        os.write(target_fd, chunk)
                    except OSError:
                        pass


_pump = _LogPump()


class LocalJob:
    """What the local backend keeps per job: its process (a Popen, or a :class:`Forked`) and output tail."""

    def __init__(self, popen: subprocess.Popen[bytes] | Forked) -> None:
        self.popen = popen
        self.tail = bytearray()


_templates: dict[tuple[str, str, tuple[str, ...]], Template | None] = {}
_templates_lock = threading.Lock()


#: What ``local_template_preload = auto`` preloads when the program imported it: modules jobs
#: of such programs almost always import too, each seconds to import per job (64 workers given
#: a numpy table in initargs: all up in 1.6 s with numpy preloaded, 4.3 s without; eight
#: stable-baselines3 SubprocVecEnv workers, whose module imports torch: 2.2 s instead of 7.5-8.3).
#: None of them starts a thread at import (the template stays single-threaded: tested).
AUTO_PRELOAD = ("numpy", "torch", "gymnasium", "stable_baselines3")


def _preload(setting: str) -> tuple[str, ...]:
    """The modules a ``local_template_preload`` setting names (``auto``: see AUTO_PRELOAD)."""
    names = [m.strip() for m in setting.split(",") if m.strip()]
    if names == ["none"]:
        return ()
    if "auto" in names:
        names = [m for m in names if m != "auto"] + [m for m in AUTO_PRELOAD if m in sys.modules]
    return tuple(dict.fromkeys(names))


def _template_for(spec: JobSpec, env: dict[str, str], preload: tuple[str, ...]) -> Template | None:
    """This master's template for ``spec``'s session and the ``preload`` modules (started on
    first use), or None where jobs cannot be forked (not Linux, another interpreter asked
    for, the template failed)."""
    if not sys.platform.startswith("linux") or not hasattr(socket, "send_fds"):
        return None
    if spec.python not in (None, sys.executable) or list(spec.args) != ["-m", "fibercore.worker"]:
        return None
    key = (spec.session, spec.env.get("FIBER_MASTER_ADDR", ""), preload)
    with _templates_lock:
        if key in _templates:
            template = _templates[key]
            if template is None or template.usable:
                return template
        base = {k: v for k, v in env.items() if k not in spec.env or k in _TEMPLATE_KEEPS}
        base.update({TEMPLATE_ENV: "1", NAME_ENV: "fiber-local-template"})
        try:
            template = Template(base, preload)
        except OSError as exc:
            sys.stderr.write(f"fiber-local: starting jobs as new interpreters ({exc}); set "
                             "local_fork_template = false to skip the template\n")
            template = None
        _retire_templates(key)
        _templates[key] = template
        return template


def _retire_templates(keep: tuple[str, str, tuple[str, ...]]) -> None:
    """Close the other templates of this process (an earlier session's, or one for other
    preload modules) that no running job needs: each is a process and a socket (lock held)."""
    for key, template in list(_templates.items()):
        if key != keep and (template is None or not template.busy):
            if template is not None:
                template.close()
            del _templates[key]


def _close_templates() -> None:
    """At the master's exit: each template sees its socket close and exits (its jobs, if any
    are left, stop through their own watchdogs and the master's cleanup)."""
    for template in list(_templates.values()):
        if template is not None:
            template.close()


def _forget_templates() -> None:
    """In a forked copy of this process: the templates are the parent's (closing this copy of
    their sockets lets each see its master's end close when the parent exits)."""
    global _templates_lock
    _templates_lock = threading.Lock()
    for template in _templates.values():
        if template is not None:
            template.close(shutdown=False)
    _templates.clear()


os.register_at_fork(after_in_child=_forget_templates)

#: What the template's environment keeps from a job's: what `fiber ps` and `fiber cleanup`
#: read from /proc/<pid>/environ, which a forked job shares with its template.
_TEMPLATE_KEEPS = ("FIBER_SESSION", "FIBER_MASTER_ADDR", "PYTHONUNBUFFERED")


#: The descriptor, inherited by the job, from which the worker reads its secrets (then closes it).
SECRET_FD_ENV = "FIBER_SECRET_FD"


def _secret_text(secret_env: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in secret_env.items())


def _secret_pipe(secret_env: dict[str, str]) -> int | None:
    """A pipe's read end holding ``secret_env`` as ``KEY=value`` lines, or None if empty.

    The values are small (well under a pipe's buffer), so they are written before the
    job starts and the write end is closed at once.
    """
    if not secret_env:
        return None
    r, w = os.pipe()
    try:
        os.write(w, _secret_text(secret_env).encode())
    finally:
        os.close(w)
    return r


def _fiber_processes(session: str | None) -> list[OwnProcess]:
    """Every local process of a fiber session (``session`` only, when given) that is this
    user's: the jobs (they carry FIBER_MASTER_ADDR) and the masters ``fiber run`` started
    (FIBER_SESSION without it). Found in /proc, held (the caller closes them): another user's
    process with the same variables is none of them (:mod:`fiber_local.owned`)."""
    found = []
    for proc in owned.scan(MASTER_PID_ENV.encode()):
        name = proc.env.get(b"FIBER_SESSION")
        if name is None or (session is not None and name.decode(errors="replace") != session):
            proc.close()
            continue
        found.append(proc)
    return found


def _is_template(proc: OwnProcess) -> bool:
    """Whether ``proc`` is a template process (:mod:`fiber_local.template`), not a job."""
    return TEMPLATE_ENV.encode() in proc.env and process_name(proc.pid) == TEMPLATE_COMM


def _master_alive(proc: OwnProcess) -> bool:
    """Whether the master that started job ``proc`` still runs (a process of this user's at
    its pid: another user's process that took the pid is not it)."""
    master = proc.env.get(MASTER_PID_ENV.encode(), b"")
    return master.isdigit() and process_alive(int(master)) and owned.is_mine(int(master))


def _own_job(jid: str) -> OwnProcess | None:
    """Local job ``jid``, held, if it is one: a fiber process of this user's on this machine."""
    if not jid.isdigit():
        return None
    proc = owned.own_process(int(jid))
    if proc is not None and MASTER_PID_ENV.encode() not in proc.env:
        proc.close()
        return None
    return proc


class Engine:
    """This machine's jobs: started, watched, stopped, found again in /proc."""

    def create(self, spec: JobSpec, config: ConfigView) -> Job:
        from fibercore.types import Job

        env = dict(os.environ)
        env.update(spec.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        env[MASTER_PID_ENV] = str(os.getpid())  # `fiber cleanup` leaves jobs of a live master alone
        env[NAME_ENV] = spec.name  # what `fiber ps` shows
        cwd = spec.cwd if spec.cwd and os.path.isdir(spec.cwd) else None
        _pump.echo = bool(config.get("local_echo_output", True))
        command = spec.argv(sys.executable)  # a job here runs this interpreter unless told otherwise
        preload = _preload(str(config.get("local_template_preload") or ""))
        template = _template_for(spec, env, preload) if config.get("local_fork_template", True) else None
        popen: subprocess.Popen[bytes] | Forked | None = None
        if template is not None:
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            try:
                popen = Forked(template, template.fork(env, cwd, _secret_text(spec.secret_env), spec.name,
                                                       [out_w, err_w]))
            except OSError as exc:  # the template died meanwhile: this job starts as a new interpreter
                sys.stderr.write(f"fiber-local: the template process failed ({exc}); starting {spec.name} "
                                 "as a new interpreter\n")
                for fd in (out_r, err_r):
                    os.close(fd)
            finally:
                os.close(out_w)
                os.close(err_w)
        if popen is None:
            secret_fd = _secret_pipe(spec.secret_env)
            pass_fds: tuple[int, ...] = ()
            if secret_fd is not None:  # never in the environment block (/proc/<pid>/environ, ps e)
                env[SECRET_FD_ENV] = str(secret_fd)
                pass_fds = (secret_fd,)
            popen = subprocess.Popen(command, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, close_fds=True, pass_fds=pass_fds)
            if secret_fd is not None:
                os.close(secret_fd)
            assert popen.stdout is not None and popen.stderr is not None
            out_r, err_r = os.dup(popen.stdout.fileno()), os.dup(popen.stderr.fileno())
            popen.stdout.close()
            popen.stderr.close()
        data = LocalJob(popen)
        _pump.add(out_r, sys.__stdout__.fileno() if sys.__stdout__ else 1, data.tail)
        _pump.add(err_r, sys.__stderr__.fileno() if sys.__stderr__ else 2, data.tail)
        return Job(jid=str(popen.pid), backend=NAME, data=data, host="127.0.0.1", pid=popen.pid, spec=spec,
                   command=command)

    def status(self, job: LocalJob) -> JobStatus:
        from fibercore.types import JobStatus

        return JobStatus.RUNNING if job.popen.poll() is None else JobStatus.EXITED

    def wait(self, job: LocalJob, timeout: float | None) -> int | None:
        try:
            return job.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def terminate(self, job: LocalJob, force: bool) -> None:
        if job.popen.poll() is None:
            try:
                job.popen.send_signal(signal.SIGKILL if force else signal.SIGTERM)
            except ProcessLookupError:
                pass

    def logs(self, job: LocalJob) -> str:
        return bytes(job.tail).decode("utf-8", "replace")

    def usage(self, job: LocalJob) -> JobUsage | None:
        """CPU time and memory of a running job, read from ``/proc``."""
        if job.popen.poll() is not None:
            return None
        return process_usage(job.popen.pid)

    def cleanup(self, session: str | None) -> int:
        """Kill local workers left by a master that is gone (any session), or every job of
        ``session`` when one is named (the user stops that session on purpose): its master
        gets SIGTERM first, so it stops its own jobs as it exits."""
        count = 0
        found = _fiber_processes(session)
        try:
            if session is not None:
                for proc in found:
                    if b"FIBER_MASTER_ADDR" not in proc.env:  # a master fiber run started
                        proc.signal(signal.SIGTERM)
                        count += 1
                time.sleep(0.5 if count else 0)
            for proc in found:
                if b"FIBER_MASTER_ADDR" not in proc.env:
                    if session is not None and proc.alive():
                        proc.signal(signal.SIGKILL)
                    continue
                if session is None and _master_alive(proc):
                    continue  # its master still runs: not a leftover
                if proc.signal(signal.SIGKILL) and not _is_template(proc):
                    count += 1  # a template process is no job of the user's
        finally:
            for proc in found:
                proc.close()
        return count

    def list_jobs(self, session: str | None) -> list[JobInfo]:
        from fibercore.types import JobInfo, JobStatus

        out = []
        for proc in _fiber_processes(session):
            with proc:
                pid, env = proc.pid, proc.env
                if _is_template(proc):
                    continue
                try:
                    created = os.stat(f"/proc/{pid}").st_mtime
                except OSError:
                    created = None
                name = ((process_name(pid) if TEMPLATE_ENV.encode() in env else None)
                        or env.get(NAME_ENV.encode(), b"?").decode(errors="replace"))
                out.append(JobInfo(jid=str(pid), backend=NAME, session=env[b"FIBER_SESSION"].decode(errors="replace"),
                                   name=name, status=JobStatus.RUNNING, host="127.0.0.1", created=created))
        return out

    def read_logs(self, jid: str) -> str | None:
        """Never the text: a local job prints to its master's terminal, and only that master
        keeps a copy (``fiber logs`` asks it while it runs); None: no such job runs."""
        from fibercore.errors import ConfigError

        proc = _own_job(jid)
        if proc is None:
            return None
        proc.close()
        raise ConfigError(
            f"local job {jid} prints to the terminal of the process that started it (with local_echo_output, "
            "the default), and no running master program of yours answered with a copy (a `fiber run` "
            "master's output is on fiber run's terminal). Redirect the program's output to a file to keep it"
        )

    def copy(self, jid: str, source: str, destination: str, into_job: bool) -> bool | None:
        """A local job shares this machine's files: paths in the job are relative to its cwd,
        and none of their components is followed when it is a link (:mod:`fiber_local.copying`)."""
        from fiber_local import copying

        proc = _own_job(jid)
        if proc is None:
            return None
        with proc:
            try:
                cwd = os.open(f"/proc/{proc.pid}/cwd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                return None
            try:
                if not proc.alive():  # the pid may name another process now: its cwd is not the job's
                    return None
                job = copying.in_job(cwd, jid, source if not into_job else destination)
            finally:
                os.close(cwd)
        here = job
        try:
            here = copying.local(destination if not into_job else source)
            if into_job:
                copying.copy(here, job)
            else:
                copying.copy(job, here)
        finally:
            job.close()
            if here is not job:
                here.close()
        return True

    def doctor(self, config: ConfigView) -> list[Check]:
        import resource

        from fibercore.types import Check

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        shm_ok = os.access("/dev/shm", os.W_OK)
        return [
            Check(NAME, "interpreter", True, f"jobs run {config.get('python_exe') or sys.executable}"),
            Check(NAME, "open files limit", soft >= 1024, f"ulimit -n is {soft}",
                  "raise it (ulimit -n 4096): every job and queue holds a few descriptors"),
            Check(NAME, "/dev/shm writable", shm_ok, "Value/Array live in POSIX shared memory",
                  "" if shm_ok else "mount a tmpfs on /dev/shm (docker run --shm-size=...)"),
        ]

    def close(self) -> None:
        """At the master's exit: the templates end (see :func:`_close_templates`)."""
        _close_templates()
