"""The vocabulary shared by the core and backend plugins.

A backend plugin knows these types and nothing else of the core (docs/architecture.md):
`JobSpec` (what to run), `Job` (a handle to what runs), `JobStatus` (where it is),
`Option` (a configuration key a plugin declares) and `ConfigView` (what a hook's
``config`` argument offers). Together with :mod:`fibercore.backendkit` and
``fibercore.hookimpl`` they are hook contract 3 (:data:`fibercore.hookspecs.CONTRACT_VERSION`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class JobStatus(enum.Enum):
    """Where a job is in its life, as far as its backend can tell."""

    PENDING = "pending"  # accepted by the backend, not running yet
    RUNNING = "running"
    EXITED = "exited"  # finished; the exit code comes from fiber_wait_job
    UNKNOWN = "unknown"  # the backend cannot tell (lost, deleted, API error)


class ConfigView(Protocol):
    """The effective configuration, as job hooks receive it (``config``).

    Values are typed (an ``int`` option gives an int); plugin keys (``docker_network``)
    are there like core ones. ``origin(name)`` says where a value came from.
    """

    def get(self, name: str, default: Any = None) -> Any: ...

    def __getitem__(self, name: str) -> Any: ...

    def origin(self, name: str) -> str: ...


@dataclass
class JobSpec:
    """What a backend must start: one job running ``argv(...)`` with ``env``.

    - ``args`` are the interpreter's arguments (``["-m", "fibercore.worker"]``);
      ``python`` is the interpreter the user asked for (``python_exe``), or None: the
      backend picks the one where the job runs (``sys.executable`` for a job on this
      machine, ``python`` on the image's PATH in a container). :meth:`argv` puts them
      together; a backend records what it really ran in :attr:`Job.command`.
    - ``session`` is the id every job of one master shares; ``labels`` carry it too
      (``fiber-session``) so that ``fiber_cleanup_jobs`` can find the jobs.
    - ``secret_env`` holds values (the session secret) that the backend must deliver by
      its safest means (a Kubernetes Secret, a file, ...) and must never log; a backend
      that has nothing better merges them into the job's environment.
    - ``cpu`` (cores), ``memory`` (MiB) and ``gpu`` (count) are requests; None: the
      backend's default.
    """

    args: list[str]
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict)
    name: str = "fiber-job"
    session: str = ""
    python: str | None = None
    image: str | None = None
    cpu: float | None = None
    memory: int | None = None  # MiB
    gpu: int | None = None
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None

    def argv(self, default_python: str) -> list[str]:
        """The command line: ``python`` (else ``default_python``) followed by ``args``."""
        return [self.python or default_python, *self.args]

    def __repr__(self) -> str:  # never print secrets
        return (
            f"JobSpec(name={self.name!r}, session={self.session!r}, python={self.python!r}, "
            f"args={self.args!r}, image={self.image!r}, cpu={self.cpu}, memory={self.memory}, "
            f"gpu={self.gpu}, labels={self.labels!r})"
        )


@dataclass(eq=False)
class Job:
    """A backend's handle to a started job.

    `jid` is the backend's identifier (a pid, a container id, a pod name, a Batch job
    id); `data` is whatever the backend keeps for itself; `pid` is an OS pid when the
    backend has one (local), used as `Process.pid`; `command` is the command line the
    backend really runs (shown when the job fails to start); `spec` what it was asked.
    """

    jid: str
    backend: str
    data: Any = None
    host: str | None = None
    pid: int | None = None
    spec: JobSpec | None = None
    command: list[str] | None = None

    def __repr__(self) -> str:
        return f"Job(jid={self.jid!r}, backend={self.backend!r}, pid={self.pid})"


@dataclass
class JobInfo:
    """One job as ``fiber ps`` lists it: found by its labels, from any process.

    ``name`` is the fibercore process name (``fiber-process`` label; ``master`` for a
    program ``fiber run`` started), ``created`` epoch seconds when the backend knows.
    """

    jid: str
    backend: str
    session: str
    name: str
    status: JobStatus
    host: str | None = None
    image: str | None = None
    created: float | None = None
    exitcode: int | None = None


@dataclass(frozen=True)
class JobUsage:
    """What a running job uses, as far as its backend can tell (``fiber top``, the dashboard).

    ``cpu_seconds`` is the job's CPU time so far (user + system; a rate comes from two
    readings), ``rss_bytes`` its resident memory; None where the backend cannot tell.
    """

    cpu_seconds: float | None = None
    rss_bytes: int | None = None


@dataclass
class Check:
    """One line of ``fiber doctor``: what was checked, whether it holds, and the fix if not."""

    backend: str
    what: str
    ok: bool
    detail: str = ""
    fix: str = ""


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on", "y", "t"):
        return True
    if text in ("0", "false", "no", "off", "n", "f", ""):
        return False
    raise ValueError(f"expected a boolean (true/false, yes/no, 1/0), got {value!r}")


@dataclass(frozen=True)
class Option:
    """A typed configuration key declared by the core or by a plugin.

    `type` is one of bool, int, float, str (or a callable converting a string);
    `default` None means "not set". `choices` restricts the accepted values.
    """

    name: str
    type: type | Callable[[Any], Any]
    default: Any = None
    help: str = ""
    choices: tuple[Any, ...] | None = None
    plugin: str = "fibercore"

    def convert(self, value: Any) -> Any:
        """Turn `value` (often a string from a file or the environment) into this type."""
        if value is None:
            return None
        if self.type is bool:
            out: Any = _to_bool(value)
        elif self.type in (int, float):
            if isinstance(value, bool):
                raise ValueError(f"expected {self.type.__name__}, got {value!r}")
            text = value.strip() if isinstance(value, str) else value
            if isinstance(text, str) and text.lower() in ("none", "null", ""):
                return None
            out = self.type(text)
        elif self.type is str:
            out = str(value)
        else:
            out = self.type(value)
        if self.choices is not None and out not in self.choices:
            raise ValueError(f"expected one of {', '.join(map(str, self.choices))}; got {value!r}")
        return out

    @property
    def type_name(self) -> str:
        return getattr(self.type, "__name__", str(self.type))


__all__ = ["Check", "ConfigView", "Job", "JobInfo", "JobSpec", "JobStatus", "JobUsage", "Option"]
