"""Jobs as processes on SSH hosts: placement by free slots, one ``ssh`` session per job.

Each job is an ``ssh HOST exec PYTHON -c LAUNCHER`` session (the OpenSSH client, so the
user's ``~/.ssh/config``, agent, ProxyJump and known_hosts apply). The command is fixed code;
the job's argv, environment and secret go to the launcher as one JSON line on stdin, so
nothing of them is on a command line or goes through a shell. Sessions to one host share a
connection (OpenSSH multiplexing) unless ``ssh_multiplex`` is off.

A session that ends without the launcher's exit record lost its host: the job is reported
killed (-9), the host is skipped for ``ssh_host_retry`` seconds, and a job that had not started
yet is placed again on another host.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any

from fiber_ssh.hosts import Host, hosts_from_config
from fiber_ssh.remote import LAUNCHER, TOOL
from fibercore.backendkit import MASTER_LABEL, PROCESS_LABEL, sessions_to_clean
from fibercore.errors import ConfigError, ProcessError

if TYPE_CHECKING:
    from fibercore.types import Check, ConfigView, Job, JobInfo, JobSpec, JobStatus

NAME = "ssh"
_numbers = itertools.count(1)  # job ids: SESSION.N

log = logging.getLogger("fiber_ssh")
LOG_KEEP = 64 * 1024
#: Bytes of a session's last output kept to say why it failed (the host's "skipped" line).
SAID_KEEP = 300
#: Seconds a session's end waits for ssh's last words on stderr (they explain a failed session).
STDERR_WAIT = 2.0
LOST = -signal.SIGKILL
#: Seconds after which a kill the host has not carried out marks it suspect for new jobs, and
#: after which the session is ended and the host skipped like a lost one.
KILL_ANSWER = 1.0
KILL_WAIT = 5.0
_MUX_RACE = b"already exists, disabling multiplexing"
#: ssh's own lines about its shared connection (one that died with a lost host), not the job's.
_MUX_NOISE = b"mux_client_"


#: This master's directory of ssh control sockets: ``<tmp>/fssh-<random>``, 0700, holding
#: the sockets and OWNER_FILE (who made it: machine, pid namespace, pid, start time).
CONTROL_PREFIX = "fssh-"
OWNER_FILE = "owner"


def _read(path: str, dir_fd: int | None = None) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        return os.read(fd, 4096).decode("ascii", "replace")
    finally:
        os.close(fd)


def process_identity(pid: int) -> str:
    """``boot_id pid-namespace pid start-time`` of ``pid`` as this process sees it; a pid
    of another machine or namespace, or one reused since, has another."""
    boot = _read("/proc/sys/kernel/random/boot_id").strip()
    namespace = os.stat("/proc/self/ns/pid").st_ino
    start = _read(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[19]
    return f"{boot} {namespace} {pid} {start}"


def make_control_dir() -> str:
    """A new control-socket directory, its owner written in it (complete or not at all:
    written aside, then renamed). Without /proc to say who it is, no owner: never swept."""
    path = tempfile.mkdtemp(prefix=CONTROL_PREFIX)
    try:
        owner = process_identity(os.getpid())
    except (OSError, IndexError):
        return path
    fd = os.open(os.path.join(path, OWNER_FILE + ".new"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, owner.encode())
    finally:
        os.close(fd)
    os.rename(os.path.join(path, OWNER_FILE + ".new"), os.path.join(path, OWNER_FILE))
    return path


def _stale(owner: str, here: str) -> bool:
    """Whether the master that wrote ``owner`` is gone: it ran on this machine in this pid
    namespace (``here``: their identity) and its pid no longer runs the same process."""
    parts = owner.split()
    if len(parts) != 4 or parts[:2] != here.split()[:2] or not parts[2].isdecimal():
        return False  # another machine sharing the directory, another namespace: theirs to judge
    try:
        return process_identity(int(parts[2])) != owner
    except FileNotFoundError:
        return True  # no such process
    except (OSError, IndexError, ValueError):
        return False  # cannot tell (hidepid, an unreadable process): left for a later sweep


def sweep_control_dirs(tmp: str | None = None) -> list[str]:
    """Remove this user's control-socket directories whose master is gone (one killed by a
    signal never ran its close). Another user's, a live master's, one of another machine or
    namespace, and one without an owner file stay. The directories it removed."""
    tmp = tmp or tempfile.gettempdir()
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(CONTROL_PREFIX)]
        here = process_identity(os.getpid())
    except (OSError, IndexError):
        return removed
    for name in names:
        path = os.path.join(tmp, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError:
            continue  # a link, a file, another user's directory we cannot open
        try:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or info.st_mode & 0o077:
                continue  # not ours, or not made by make_control_dir: never touched
            if not _stale(_read(OWNER_FILE, dir_fd=fd), here):
                continue
            for entry in os.listdir(fd):  # its sockets and owner file, through the open directory
                os.unlink(entry, dir_fd=fd)
        except OSError:
            continue
        finally:
            os.close(fd)
        try:
            os.rmdir(path)  # only if empty: whatever took the name meanwhile stays
            removed.append(path)
        except OSError:
            pass
    return removed


def alive_probes(interval: float | None, timeout: float | None) -> tuple[int, int]:
    """ssh's ServerAliveInterval and ServerAliveCountMax for the core's heartbeat settings:
    whole seconds (ssh's unit), probes spanning at least ``heartbeat_timeout``."""
    every = max(1, round(float(interval or 2.0)))
    return every, max(1, math.ceil(float(timeout or 20.0) / every))


class SshError(ProcessError):
    """An ssh session failed; the message has ssh's own words, ``fix`` what to check."""

    def __init__(self, message: str, fix: str = "", code: int | None = None) -> None:
        super().__init__(message)
        self.fix = fix
        self.code = code  # the session's exit status, if it ended


def what_to_check(code: int | None, said: str, python: str) -> str:
    """What to look at when a session on a host ended with exit ``code`` before its program
    ran: ssh's 255 is the connection or the key; the shell's 127/126 is the host's Python."""
    if code in (126, 127):
        return (f"the host has no Python at {python}: install Python 3 with fibercore there, or set "
                "python= for the host in ssh_hostfile (or ssh_python)")
    if "No module named" in said:
        return ("install fibercore (and the program's own dependencies) in the host's Python, or point "
                "python= in ssh_hostfile (or ssh_python) at an environment that has them")
    if code == 255 or code is None:
        return ("check that `ssh -o BatchMode=yes HOST true` works with ssh_identity and ssh_options "
                "(key, known_hosts, port)")
    return (f"ssh got in but the host's Python failed (exit {code}): check that `ssh HOST {python} -c "
            "'import fibercore'` works there (python= in ssh_hostfile, or ssh_python)")


class SshJob:
    """One job: where it was placed, its session, its output, how it ended."""

    def __init__(self, jid: str, name: str, request: dict[str, Any], slots: int, python: str | None) -> None:
        self.jid = jid
        self.name = name
        self.request = request
        self.slots = slots
        self.python = python
        self.host: Host | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid: int | None = None  # on the host
        self.exitcode: int | None = None
        self.started = threading.Event()
        self.done = threading.Event()
        self.output: collections.deque[bytes] = collections.deque()
        self.output_size = 0
        #: The current session's last words (its stdout and ssh's stderr): why it failed, in
        #: the host's "skipped" line; never an earlier session's (another host's) words.
        self.said = b""
        self.stderr_reader: threading.Thread | None = None
        self.tried: set[str] = set()
        self.sessions = 0  # sessions started for it
        #: Sessions that failed before it ran, by host: it gives up once every host failed it twice.
        self.failed_on: dict[str, int] = {}
        self.cancelled: str | None = None  # "term" or "kill" once terminate()/kill() asked
        self.kill_sent: float | None = None  # when kill() was first asked (monotonic)
        self.kill_answered = False  # the launcher said it signalled the job's group
        self.started_at: float | None = None
        self.note = ""
        self.engine: Any = None  # the Engine that placed it

    def kill_unanswered_for(self, now: float) -> float:
        """Seconds a kill has waited for the launcher's answer since the job ran (0: none
        waits; a session still connecting has not been asked yet)."""
        if self.kill_sent is None or self.kill_answered or self.started_at is None:
            return 0.0
        return now - max(self.kill_sent, self.started_at)

    def keep(self, chunk: bytes, proc: Any = None) -> None:
        """Keep ``chunk`` of the job's output (``proc``: the session it came from)."""
        if proc is not None and proc is self.proc:
            self.said = (self.said + chunk)[-SAID_KEEP:]
        self.output.append(chunk)
        self.output_size += len(chunk)
        while self.output_size > LOG_KEEP and len(self.output) > 1:
            self.output_size -= len(self.output.popleft())


class Engine:
    """One per configuration: the hosts, the jobs waiting for a slot, the running sessions."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.hosts = hosts_from_config(cfg.get("ssh_hosts"), cfg.get("ssh_hostfile"))
        self.lock = threading.RLock()
        self.pending: collections.deque[SshJob] = collections.deque()
        self.jobs: dict[str, SshJob] = {}
        self.echo = bool(cfg.get("ssh_echo_output", True))
        self.control_dir = None
        if cfg.get("ssh_multiplex", True):
            sweep_control_dirs()
            self.control_dir = make_control_dir()
        self.closing = False
        self.retry_timer: threading.Timer | None = None
        if shutil.which("ssh") is None:
            raise SshError("the ssh client is not installed here: apt-get install openssh-client "
                           "(fiber-ssh starts every job with it)")
        self._probe_slots()

    # -- ssh ----------------------------------------------------------------------------------
    def ssh_argv(self, host: Host, command: str, *, batch_tool: bool = False) -> list[str]:
        """The ``ssh`` command line for ``command`` on ``host`` (options before ``--``)."""
        cfg = self.cfg
        # ssh gives up on a silent host after the core's own bound (heartbeat_timeout), not
        # sooner: a partition shorter than that costs nothing (docs/cluster.md).
        interval, count = alive_probes(cfg.get("heartbeat_interval"), cfg.get("heartbeat_timeout"))
        argv = ["ssh", "-T", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(cfg.get('ssh_connect_timeout') or 10)}",
                "-o", f"ServerAliveInterval={interval}", "-o", f"ServerAliveCountMax={count}", "-o", "LogLevel=ERROR"]
        if self.control_dir:
            argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
                     "-o", "ControlPersist=15"]
        port = host.port or cfg.get("ssh_port")
        if port:
            argv += ["-p", str(port)]
        if cfg.get("ssh_identity"):
            argv += ["-i", os.path.expanduser(cfg.get("ssh_identity"))]
        argv += shlex.split(cfg.get("ssh_options") or "")
        return [*argv, "--", host.name, command]

    def python_of(self, host: Host, job_python: str | None) -> str:
        return job_python or host.python or self.cfg.get("ssh_python") or sys.executable

    def tool(self, host: Host, request: dict[str, Any], timeout: float = 20) -> Any:
        """Run the fixed TOOL program on ``host`` with ``request``; its JSON answer."""
        python = self.python_of(host, None)
        argv = self.ssh_argv(host, f"exec {shlex.quote(python)} -c {shlex.quote(TOOL)}")
        try:
            done = subprocess.run(argv, input=json.dumps(request) + "\n", capture_output=True, text=True,
                                  timeout=timeout)
        except FileNotFoundError:
            raise SshError("the ssh client is not installed here (apt-get install openssh-client)") from None
        except subprocess.TimeoutExpired:
            raise SshError(f"{host.name}: no answer within {timeout:.0f} s") from None
        if done.returncode != 0:
            said = done.stderr.strip()[-500:]
            raise SshError(f"{host.name}: ssh failed (exit {done.returncode}): {said}",
                           what_to_check(done.returncode, said, python), done.returncode)
        return json.loads(done.stdout)

    def _probe_slots(self) -> None:
        """Hosts listed without ``slots`` get their CPU count (asked in parallel, once)."""
        def probe(host: Host) -> None:
            try:
                host.slots = int(self.tool(host, {"kind": "info"})["cpus"] or 1)
            except Exception as exc:  # unreachable now: skipped until ssh_host_retry, 1 slot
                host.slots = 1
                self._mark_down(host, str(exc))

        threads = [threading.Thread(target=probe, args=(h,)) for h in self.hosts if h.slots is None]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _mark_down(self, host: Host, reason: str) -> None:
        host.down_until = time.monotonic() + float(self.cfg.get("ssh_host_retry") or 30)
        host.down_reason = reason
        log.warning("fiber-ssh: host %s is skipped for %.0f s: %s", host.name,
                    float(self.cfg.get("ssh_host_retry") or 30), reason)

    # -- placement ------------------------------------------------------------------------------
    def submit(self, jid: str, name: str, request: dict[str, Any], slots: int, python: str | None) -> SshJob:
        largest = max(h.slots or 1 for h in self.hosts)
        if slots > largest:
            raise ConfigError(f"{name} needs {slots} slots (cpu=) but the largest host has {largest}; "
                              "ask for fewer CPUs or add slots in ssh_hosts / ssh_hostfile")
        job = SshJob(jid, name, request, slots, python)
        job.engine = self
        with self.lock:
            self.jobs[jid] = job
            self.pending.append(job)
            self._place()
        return job

    def _choose(self, job: SshJob) -> Host | None:
        now = time.monotonic()
        usable = [h for h in self.hosts if h.down_until <= now and (h.slots or 1) - h.used >= job.slots]
        # A host that has not answered a kill for a second is likely cut off (the core declared
        # a job of it lost before ssh's probes gave up): a new job goes elsewhere if it can.
        usable = [h for h in usable if not self._unanswered(h, now)] or usable
        fresh = [h for h in usable if h.name not in job.tried] or usable
        # The least loaded host (by the share of its slots in use), then the one with most room.
        return max(fresh, key=lambda h: (1 - h.used / (h.slots or 1), (h.slots or 1) - h.used), default=None)

    def _place(self) -> None:
        """Start pending jobs, in order, while a host has room (called under the lock)."""
        while self.pending and not self.closing:
            job = self.pending[0]
            host = self._choose(job)
            if host is None:
                job.note = "waiting for a free slot: " + "; ".join(self.describe(h) for h in self.hosts)
                if any(h.down_until > time.monotonic() for h in self.hosts):
                    self._retry_later()
                return
            self.pending.popleft()
            self._launch(job, host)

    def _retry_later(self) -> None:
        """Place again when the first skipped host may be tried (one timer at a time)."""
        if self.retry_timer is not None:
            return
        wake = min(h.down_until for h in self.hosts) - time.monotonic()
        self.retry_timer = threading.Timer(max(0.1, wake), self._replace)
        self.retry_timer.daemon = True
        self.retry_timer.start()

    def _replace(self) -> None:
        with self.lock:
            self.retry_timer = None
            self._place()

    def _unanswered(self, host: Host, now: float) -> bool:
        """A kill sent to a job of ``host`` more than KILL_ANSWER seconds ago is unanswered."""
        for jid in host.jobs:
            job = self.jobs.get(jid)
            if job is not None and job.kill_unanswered_for(now) > KILL_ANSWER:
                return True
        return False

    def describe(self, host: Host) -> str:
        if host.down_until > time.monotonic():
            return f"{host.name} down ({host.down_reason})"
        return f"{host.name} {host.used}/{host.slots} slots used"

    def _launch(self, job: SshJob, host: Host) -> None:
        host.used += job.slots
        host.jobs.add(job.jid)
        job.host = host
        job.tried.add(host.name)
        job.sessions += 1
        job.note = ""
        job.said = b""
        python = self.python_of(host, job.python)
        request = {**job.request, "argv": [python, *job.request["args"]]}
        argv = self.ssh_argv(host, f"exec {shlex.quote(python)} -c {shlex.quote(LAUNCHER)}")
        job.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    start_new_session=True)
        assert job.proc.stdin is not None
        try:
            job.proc.stdin.write(json.dumps(request).encode() + b"\n")
            job.proc.stdin.flush()
        except OSError:
            pass  # the session already ended: the waiter says why
        # The stderr reader first: the records' reader joins it when the session ends.
        reader = threading.Thread(target=self._read_stderr, args=(job, job.proc), daemon=True)
        reader.start()
        job.stderr_reader = reader
        threading.Thread(target=self._read_records, args=(job, job.proc), daemon=True,
                         name=f"fiber-ssh-{job.jid}").start()

    # -- a session's streams -------------------------------------------------------------------
    def _read_records(self, job: SshJob, proc: subprocess.Popen[bytes]) -> None:
        stream = proc.stdout
        assert stream is not None
        exitcode = None
        while True:
            head = stream.read(5)
            if len(head) < 5:
                break
            kind, size = head[:1], struct.unpack(">I", head[1:])[0]
            data = stream.read(size)
            if kind == b"P":
                job.pid = int(data)
                job.started_at = time.monotonic()
                job.started.set()
            elif kind == b"K":
                if data == b"%d" % signal.SIGKILL:  # the answer to a kill (a SIGTERM's says nothing of it)
                    job.kill_answered = True
            elif kind == b"O":
                job.keep(data, proc)
                if self.echo:
                    sys.stdout.write(data.decode("utf-8", "replace"))
                    sys.stdout.flush()
            elif kind == b"X":
                exitcode = int(data)
                job.kill_answered = True  # the host answered: the job is over (a kill after it reaches nobody)
        code = proc.wait()
        reader = job.stderr_reader
        if reader is not None and job.proc is proc:  # ssh's last words (why it failed) first
            reader.join(STDERR_WAIT)
        self._ended(job, proc, exitcode, code)

    def _read_stderr(self, job: SshJob, proc: subprocess.Popen[bytes]) -> None:
        stream = proc.stderr
        assert stream is not None
        for line in iter(stream.readline, b""):
            if _MUX_RACE in line or line.startswith(_MUX_NOISE):
                continue  # two first sessions raced to open the shared connection, or it was lost
            job.keep(line, proc)
            if self.echo:
                sys.stderr.write(line.decode("utf-8", "replace"))
                sys.stderr.flush()

    def _ended(self, job: SshJob, proc: subprocess.Popen[bytes], exitcode: int | None, ssh_code: int) -> None:
        with self.lock:
            host = job.host
            assert host is not None
            host.used -= job.slots
            host.jobs.discard(job.jid)
            if exitcode is not None:
                job.exitcode = exitcode
            elif job.cancelled:
                job.exitcode = LOST if job.cancelled == "kill" else -signal.SIGTERM
            else:
                tail = job.said.decode("utf-8", "replace").strip()
                self._mark_down(host, f"ssh exit {ssh_code}: {tail or 'connection lost'}")
                if not job.started.is_set():
                    job.failed_on[host.name] = job.failed_on.get(host.name, 0) + 1
                if not job.started.is_set() and any(job.failed_on.get(h.name, 0) < 2 for h in self.hosts):
                    job.host, job.proc = None, None
                    self.pending.appendleft(job)  # never ran: try another host
                    self._place()
                    return
                job.exitcode = LOST
                if job.started.is_set():
                    job.note = f"lost with host {host.name} (ssh exit {ssh_code})"
                else:  # every host refused it, twice: say why, and what to look at
                    fix = what_to_check(ssh_code, tail, self.python_of(host, job.python))
                    job.note = (f"fiber-ssh could not start it on any host ({job.sessions} ssh sessions failed; "
                                f"the last, on {host.name}: ssh exit {ssh_code}: {tail or 'connection lost'}): "
                                f"{fix}; `fiber doctor` checks every host")
            job.done.set()
            self._place()

    # -- the hook operations --------------------------------------------------------------------
    def create(self, spec: JobSpec, config: ConfigView) -> Job:
        """Queue the job for the host with the most free slots; the secret goes over the ssh
        session's stdin, never on a command line."""
        from fibercore.types import Job

        if spec.labels.get("fiber-detached") == "true":
            raise ConfigError("fiber run --detach cannot work on ssh: a job ends with the ssh session of the "
                              "command that started it. Run without --detach inside tmux, screen or nohup")
        jid = f"{spec.session}.{next(_numbers)}"
        # No cwd (a master from `fiber run`): the creator's, as hosts usually share the file system;
        # the launcher falls back to the home directory where the path does not exist.
        request = {"jid": jid, "name": spec.name, "args": list(spec.args), "env": dict(spec.env),
                   "cwd": spec.cwd or os.getcwd(),
                   "secret": spec.secret_env.get("FIBER_SECRET", ""), "master": spec.labels.get(MASTER_LABEL, "")}
        slots = max(1, math.ceil(spec.cpu or 1))
        job = self.submit(jid, spec.name, request, slots, spec.python)
        return Job(jid=jid, backend=NAME, data=job, spec=spec, command=["ssh", "HOST", *spec.argv("python")])

    def status(self, job: SshJob) -> JobStatus:
        from fibercore.types import JobStatus

        if job.done.is_set():
            return JobStatus.EXITED
        return JobStatus.RUNNING if job.started.is_set() else JobStatus.PENDING

    def wait(self, job: SshJob, timeout: float | None) -> int | None:
        return job.exitcode if job.done.wait(timeout) else None

    def terminate(self, job: SshJob, force: bool) -> None:
        """SIGTERM/SIGKILL to the job's process group; a job still waiting for a slot just ends."""
        with self.lock:
            if job.done.is_set():
                return
            if job in self.pending:
                self.pending.remove(job)
                job.exitcode = LOST if force else -signal.SIGTERM
                job.done.set()
                return
            job.cancelled = "kill" if force else (job.cancelled or "term")
            first_kill = force and job.kill_sent is None
            if first_kill:
                job.kill_sent = time.monotonic()
            proc = job.proc
        if proc is None or proc.stdin is None:
            return
        try:
            proc.stdin.write(b"%d\n" % (signal.SIGKILL if force else signal.SIGTERM))
            proc.stdin.flush()
        except (OSError, ValueError):
            pass
        if first_kill:  # a host that does not answer: end the session, which ends the job
            timer = threading.Timer(KILL_WAIT, self._kill_unanswered, args=(job, proc))
            timer.daemon = True
            timer.start()

    def _kill_unanswered(self, job: SshJob, proc: subprocess.Popen[bytes]) -> None:
        """The job did not end within KILL_WAIT of a kill: the session ends; if the launcher
        did not even say it signalled the job (the host is cut off), the host is skipped like
        one whose connection was lost (ssh_host_retry). A session still connecting when the
        kill was sent, or a job whose own daemon keeps its output open, is no sign of that."""
        with self.lock:
            if job.done.is_set() or proc.poll() is not None:
                return
            if job.host is not None and job.proc is proc and job.kill_unanswered_for(time.monotonic()) > KILL_ANSWER:
                self._mark_down(job.host, f"it did not answer a kill within {KILL_WAIT:.0f} s")
        proc.kill()

    def logs(self, job: SshJob) -> str:
        text = b"".join(job.output).decode("utf-8", "replace")
        return f"{job.note}\n{text}" if job.note else text

    def close(self) -> None:
        """End every session (each launcher then kills its job) and the shared connections."""
        with self.lock:
            self.closing = True
            sessions = [j.proc for j in self.jobs.values() if j.proc is not None and not j.done.is_set()]
        for proc in sessions:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
            except OSError:
                pass
        deadline = time.monotonic() + 3
        for proc in sessions:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.control_dir:
            for host in self.hosts:
                argv = self.ssh_argv(host, "")[:-1]
                argv.insert(1, "-O")
                argv.insert(2, "exit")
                subprocess.run(argv, capture_output=True, timeout=10)
            shutil.rmtree(self.control_dir, ignore_errors=True)

    # -- sessions, from any process ----------------------------------------------------------
    def each_host(self, request: dict[str, Any]) -> list[tuple[Host, Any]]:
        """``request`` to every reachable host's TOOL, in parallel; (host, answer) pairs."""
        answers: list[tuple[Host, Any]] = []

        def ask(host: Host) -> None:
            try:
                answers.append((host, self.tool(host, request)))
            except SshError as exc:
                log.warning("fiber-ssh: %s", exc)

        threads = [threading.Thread(target=ask, args=(h,)) for h in self.hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return answers

    def list_jobs(self, session: str | None) -> list[JobInfo]:
        from fibercore.types import JobInfo, JobStatus

        out = []
        for host, found in self.each_host({"kind": "list", "prefix": f"{session}." if session else ""}):
            for _pid, jid, name, *_ in found:
                out.append(JobInfo(jid=jid, backend="ssh", session=jid.split(".", 1)[0], name=name,
                                   status=JobStatus.RUNNING, host=host.name))
        return out

    def cleanup(self, session: str | None) -> int:
        """Stop the jobs of ``session`` on every host; None: of every session whose master is
        gone (:func:`fibercore.backendkit.sessions_to_clean`; a job's environment names it)."""
        if session is not None:
            return self._stop(session)
        jobs = [(jid.split(".", 1)[0], {MASTER_LABEL: rest[0] if rest else "", PROCESS_LABEL: name}, True)
                for _, found in self.each_host({"kind": "list", "prefix": ""})
                for _pid, jid, name, *rest in found]
        return sum(self._stop(s) for s in sessions_to_clean(jobs))

    def _stop(self, session: str) -> int:
        return sum(int(n) for _, n in self.each_host({"kind": "stop", "prefix": f"{session}."}))

    def read_logs(self, jid: str) -> str | None:
        """The output of one of this master's jobs; a job of another master streams to that
        master's terminal (nothing is kept on the hosts)."""
        session, dot, number = jid.partition(".")
        if not (dot and number.isdigit()):
            return None
        job = self.jobs.get(jid)
        if job is not None:
            return self.logs(job)
        raise ConfigError(f"the output of ssh job {jid} streams to the terminal of its master (fiber-ssh keeps "
                          "no log files on the hosts); read it there, or redirect the program's output")

    def doctor(self, config: ConfigView) -> list[Check]:
        """Each host: reachable with keys, and its Python has fibercore."""
        from fibercore.types import Check

        checks = []
        for host in self.hosts:
            try:
                info = self.tool(host, {"kind": "info"}, timeout=10)
            except SshError as exc:
                if exc.code in (None, 255):  # ssh itself: the connection or the key
                    checks.append(Check(NAME, f"{host.name} reachable with keys (BatchMode)", False, str(exc),
                                        exc.fix or "check ssh -o BatchMode=yes HOST true works (key, known_hosts, "
                                        "port)"))
                else:  # ssh got in; the host's Python did not answer
                    checks.append(Check(NAME, f"{host.name} reachable with keys (BatchMode)", True, ""))
                    checks.append(Check(NAME, f"{host.name} runs Python with fibercore", False, str(exc), exc.fix))
                continue
            checks.append(Check(NAME, f"{host.name} runs Python with fibercore", bool(info.get("fibercore")),
                                f"Python {info.get('python')}, fibercore {info.get('fibercore')}, "
                                f"{info.get('cpus')} CPUs, {host.slots} slots",
                                "install fibercore on the host, or set python= for it in ssh_hostfile (or "
                                "ssh_python)"))
        return checks
