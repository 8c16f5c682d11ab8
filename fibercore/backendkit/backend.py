"""A backend is its engine plus declarations: :class:`EngineBackend` holds the skeleton
every backend shares (the hooks that only delegate, the engine of each configuration, the
"is this job mine" check, closing at exit), and :class:`Engine` is what a backend writes.

A backend plugin subclasses :class:`EngineBackend`, names itself, says which config keys
make a different engine, builds one in :meth:`EngineBackend.make_engine`, and adds the
hooks that are declarations (its config options, the address jobs reach, detection). Its
entry point names the instance: ``docker = "fiber_docker.plugin:plugin"``.
docs/writing-a-backend.md walks through one.
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, runtime_checkable

from fibercore.hookspecs import hookimpl

if TYPE_CHECKING:
    from fibercore.types import Check, ConfigView, Job, JobInfo, JobSpec, JobStatus, JobUsage, Option


@runtime_checkable
class Engine(Protocol):
    """One backend's work, one verb per operation. ``record`` is what :meth:`create` put in
    ``Job.data`` (the engine's own handle to the job: a container, a pod, a Batch job).

    1. ``create(spec, config)``: start a job running ``spec.argv(<interpreter>)`` with
       ``spec.env``, the secret of ``spec.secret_env`` by a channel no one else reads, and
       ``spec.labels`` where :meth:`list_jobs` finds them; return the :class:`Job`.
    2. ``status(record)``, ``wait(record, timeout)`` (the exit code in multiprocessing's
       convention, None while it runs), ``terminate(record, force)`` (SIGTERM, or SIGKILL
       when ``force``; a job already gone is no error), ``logs(record)``.
    3. ``cleanup(session)``: remove the jobs of ``session``; None: of every session whose
       master is gone (:func:`~fibercore.backendkit.sessions_to_clean`,
       :func:`~fibercore.backendkit.clean_session`). Returns how many.
    4. ``list_jobs(session)`` and ``read_logs(jid)`` (None: no job of this backend by that
       id) work from any process: they find jobs by their labels, not by memory.
    5. ``close()``: at the master's exit, stop what still runs and remove what this engine
       made (secrets, watches).

    Optional verbs, declared by :class:`EngineBackend`'s ``follows_logs``, ``copies_files``
    and ``reports_usage``: ``follow(record) -> Iterator[str]``, ``copy(jid, source,
    destination, into_job) -> bool | None``, ``usage(record) -> JobUsage | None`` (quick:
    called once a second per job while ``fiber top`` or the dashboard looks); and
    ``doctor(config) -> list[Check]`` (fiber doctor's checks once the engine is made).
    """

    def create(self, spec: JobSpec, config: ConfigView) -> Job: ...

    def status(self, record: Any) -> JobStatus: ...

    def wait(self, record: Any, timeout: float | None) -> int | None: ...

    def terminate(self, record: Any, force: bool) -> None: ...

    def logs(self, record: Any) -> str: ...

    def cleanup(self, session: str | None) -> int: ...

    def list_jobs(self, session: str | None) -> list[JobInfo]: ...

    def read_logs(self, jid: str) -> str | None: ...

    def close(self) -> None: ...


E = TypeVar("E", bound=Engine)


class EngineBackend(Generic[E]):
    """The hooks of a backend that delegate to its :class:`Engine`, written once.

    Subclass and set :attr:`NAME` (``FIBER_BACKEND`` value), :attr:`ALIASES`,
    :attr:`DISTRIBUTION`, :attr:`ENGINE_KEYS` (config keys whose values make a different
    engine), and implement :meth:`make_engine`. ``follows_logs`` / ``copies_files`` /
    ``reports_usage`` declare the optional verbs; without them the hooks are not registered at all.

    Engines are made on first use, one per value of :attr:`ENGINE_KEYS`: ``fibercore.init()``
    with another cluster gets its own, while jobs keep the engine that started them. Every
    engine is closed at exit (registered when the plugin is made, at import, so it runs after
    fibercore joined its jobs).
    """

    #: The hook contract the subclass is written for (``FIBER_CONTRACT = 3``; see
    #: :mod:`fibercore.hookspecs`): a core that no longer speaks it refuses the plugin with the fix.
    FIBER_CONTRACT: ClassVar[int | None] = None
    NAME: ClassVar[str] = ""
    ALIASES: ClassVar[tuple[str, ...]] = ()
    DISTRIBUTION: ClassVar[str] = ""
    ENGINE_KEYS: ClassVar[tuple[str, ...]] = ()
    follows_logs: ClassVar[bool] = False
    copies_files: ClassVar[bool] = False
    reports_usage: ClassVar[bool] = False
    #: What fiber doctor says when :meth:`make_engine` fails, and the fix.
    reach_check: ClassVar[str] = "engine reachable"
    reach_fix: ClassVar[str] = "check the backend's configuration (fiber config)"

    def __init__(self) -> None:
        self._engines: dict[tuple[Any, ...], E] = {}
        self._made_by: weakref.WeakKeyDictionary[Job, E] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        if not self.follows_logs:
            self.fiber_follow_logs = None  # type: ignore[assignment]  # not a hook: not registered
        if not self.copies_files:
            self.fiber_copy_files = None  # type: ignore[assignment]
        if not self.reports_usage:
            self.fiber_job_usage = None  # type: ignore[assignment]
        atexit.register(self.close)

    # -- what a backend writes ----------------------------------------------------------------
    def make_engine(self, config: ConfigView) -> E:
        """A new engine for ``config`` (import the backend's heavy modules here)."""
        raise NotImplementedError

    def option(self, name: str, typ: Any, default: Any, text: str,
               choices: tuple[Any, ...] | None = None) -> Option:
        """A config option of this backend (for ``fiber_config_options``)."""
        from fibercore.types import Option

        return Option(name, typ, default, text, choices=choices, plugin=self.DISTRIBUTION or self.NAME)

    def doctor(self, config: ConfigView) -> list[Check]:
        """``fiber doctor``'s checks: the engine can be made, then the engine's own ``doctor()``."""
        from fibercore.types import Check

        try:
            eng = self.engine(config)
        except Exception as exc:
            return [Check(self.NAME, self.reach_check, False, f"{type(exc).__name__}: {exc}", self.reach_fix)]
        own = getattr(eng, "doctor", None)
        return list(own(config)) if own is not None else [Check(self.NAME, self.reach_check, True)]

    # -- the kit -----------------------------------------------------------------------------
    def engine(self, config: ConfigView) -> E:
        """The engine of ``config`` (made on first use)."""
        key = tuple(config.get(k) for k in self.ENGINE_KEYS)
        with self._lock:
            eng = self._engines.get(key)
            if eng is None:
                eng = self._engines[key] = self.make_engine(config)
        return eng

    def owns(self, job: Job) -> bool:
        """Whether ``job`` is one of this backend's (hooks answer None for others)."""
        return getattr(job, "backend", None) in (self.NAME, *self.ALIASES)

    def engine_of(self, job: Job, config: ConfigView) -> E | None:
        """The engine that made ``job``; None when it is not this backend's."""
        if not self.owns(job):
            return None
        return self._made_by.get(job) or self.engine(config)

    def close(self) -> None:
        """Close every engine (at exit); a later call makes new ones."""
        with self._lock:
            engines = list(self._engines.values())
            self._engines.clear()
        for eng in engines:
            try:
                eng.close()
            except Exception:  # at exit: one engine's failure must not keep the others open
                pass

    # -- the hooks that delegate -------------------------------------------------------------
    @hookimpl
    def fiber_create_job(self, spec: JobSpec, config: ConfigView) -> Job:
        eng = self.engine(config)
        job = eng.create(spec, config)
        self._made_by[job] = eng
        return job

    @hookimpl
    def fiber_job_status(self, job: Job, config: ConfigView) -> JobStatus | None:
        eng = self.engine_of(job, config)
        return None if eng is None else eng.status(job.data)

    @hookimpl
    def fiber_wait_job(self, job: Job, timeout: float | None, config: ConfigView) -> int | None:
        eng = self.engine_of(job, config)
        return None if eng is None else eng.wait(job.data, timeout)

    @hookimpl
    def fiber_terminate_job(self, job: Job, force: bool, config: ConfigView) -> bool | None:
        eng = self.engine_of(job, config)
        if eng is None:
            return None
        eng.terminate(job.data, force)
        return True

    @hookimpl
    def fiber_job_logs(self, job: Job, config: ConfigView) -> str | None:
        eng = self.engine_of(job, config)
        return None if eng is None else eng.logs(job.data)

    @hookimpl
    def fiber_cleanup_jobs(self, session: str | None, config: ConfigView) -> int:
        return self.engine(config).cleanup(session)

    @hookimpl
    def fiber_list_jobs(self, session: str | None, config: ConfigView) -> list[JobInfo]:
        return self.engine(config).list_jobs(session)

    @hookimpl
    def fiber_read_job_logs(self, jid: str, config: ConfigView) -> str | None:
        return self.engine(config).read_logs(jid)

    @hookimpl
    def fiber_follow_logs(self, job: Job, config: ConfigView) -> Iterator[str] | None:
        eng = self.engine_of(job, config)
        return None if eng is None else eng.follow(job.data)  # type: ignore[attr-defined]

    @hookimpl
    def fiber_copy_files(self, jid: str, source: str, destination: str, into_job: bool,
                         config: ConfigView) -> bool | None:
        return self.engine(config).copy(jid, source, destination, into_job)  # type: ignore[attr-defined]

    @hookimpl
    def fiber_job_usage(self, job: Job, config: ConfigView) -> JobUsage | None:
        eng = self.engine_of(job, config)
        return None if eng is None else eng.usage(job.data)  # type: ignore[attr-defined]

    @hookimpl
    def fiber_doctor(self, config: ConfigView) -> list[Check]:
        return self.doctor(config)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} backend {self.NAME!r}>"
