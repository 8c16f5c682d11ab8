# mypy: disable-error-code="empty-body"
# (a hook spec is its signature and docstring; plugins give the bodies)
"""The one contract between fibercore and its plugins.

Every hook is prefixed ``fiber_`` and marked with ``HookspecMarker("fiber")``.
Plugins implement them with ``@fibercore.hookimpl``. Within one contract version,
specs only ever grow by adding arguments; an implementation may accept fewer
arguments than its spec (pluggy's opt-in arguments), so it keeps working.

Contract version (:data:`CONTRACT_VERSION`, shown by ``fiber backends``): a plugin
declares the version it was written for as ``FIBER_CONTRACT = 3`` (a module attribute,
or a class attribute of a plugin object). The core refuses, with the fix in the message,
a plugin that declares a version it does not speak (older than
:data:`MIN_CONTRACT_VERSION` or newer than its own). Contract 3: every hook's parameters,
result and calling rule are written below; ``fiber_cleanup_jobs(None)`` has one meaning
(the jobs of sessions whose master is gone); every hook that takes a configuration takes
a :class:`fibercore.types.ConfigView`; a backend may be an object
(:class:`fibercore.backendkit.EngineBackend`) named by its entry point. Contract 2 gave
job hooks the effective ``config``, and ``JobSpec`` its ``session``, ``python`` and
``args``; a backend reports what it runs in ``Job.command`` and never changes the spec. A backend needs
only the public names: :mod:`fibercore.types`, :mod:`fibercore.backendkit`,
``fibercore.hookimpl`` (and :mod:`fibercore.testing` in its tests).

The core never calls ``pm.hook`` directly: it goes through the typed facade in
:mod:`fibercore.plugins`, which also resolves the transport and serializer once.

Hooks, in lifecycle order:

    discovery ─ fiber_detect_backend, fiber_config_defaults, fiber_config_options
    jobs      ─ fiber_listen_host, fiber_create_job, fiber_job_status,
                fiber_wait_job, fiber_terminate_job, fiber_job_logs, fiber_cleanup_jobs,
                fiber_job_secret
    operations ─ fiber_list_jobs, fiber_read_job_logs, fiber_follow_logs,
                fiber_copy_files, fiber_job_usage, fiber_doctor (the ``fiber``
                command, ``fiber top`` and the dashboard; optional)
    transport ─ fiber_transport
    serialize ─ fiber_serializer
    observers ─ fiber_job_started, fiber_job_exited, fiber_worker_start
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from fibercore.serialization import Serializer
    from fibercore.transport import Transport
    from fibercore.types import Check, ConfigView, Job, JobInfo, JobSpec, JobStatus, JobUsage, Option

PROJECT_NAME = "fiber"

#: The version of this contract (hook signatures and the types they exchange).
CONTRACT_VERSION = 3
#: The oldest declared version this core still loads.
MIN_CONTRACT_VERSION = 3

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


# ---------------------------------------------------------------------------
# Discovery and configuration
# ---------------------------------------------------------------------------


@hookspec
def fiber_detect_backend() -> str | None:
    """Say which backend this environment calls for, if any.

    Called once by the core at initialisation, on every installed backend and
    extension, when neither ``fibercore.init(backend=)``, ``FIBER_BACKEND`` nor the
    config file chose a backend. All results are collected; the first non-None
    answer (in plugin registration order) is used, else ``local``.

    Must be cheap and side-effect free: look at environment variables or files
    (``KUBERNETES_SERVICE_HOST``, ``AWS_BATCH_JOB_ID``), never at the network.

    :return: a backend name (an entry-point name of group ``fiber.backends``) or None.
    """


@hookspec
def fiber_config_defaults() -> dict[str, Any] | None:
    """Values the selected backend prefers for core config keys.

    Called once when the configuration is built. The result sits between the keys'
    own defaults and every user source (file, environment, ``init()``), so users
    still override it. Typical answers: ``pool_processes`` (how many workers
    ``Pool()`` starts: the local backend says ``os.cpu_count()``) and
    ``pool_start_concurrency`` (how many jobs a Pool starts at once: jobs sharing
    this machine's CPUs start faster a few at a time). Results of all plugins are
    merged; on a conflict the higher-priority plugin (``tryfirst``) wins.

    :return: a mapping of core config keys to values, or None.
    """


@hookspec
def fiber_config_options() -> list[Option]:
    """Declare the configuration keys this plugin adds.

    Called once by the core after plugins are loaded, on every plugin; the results
    are concatenated. The core types, validates and documents these keys exactly
    like its own: they may be set in ``.fiberconfig``, ``[tool.fiber]``, as
    ``FIBER_<NAME>`` or through ``fibercore.init(name=...)``.

    :return: a list of :class:`fibercore.types.Option`. Names must be unique across
        plugins; a clash is a start-up error naming both plugins.
    """


# ---------------------------------------------------------------------------
# Jobs (answered by the selected backend; firstresult)
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def fiber_listen_host(config: ConfigView) -> str | None:
    """Return the address this process must advertise so that jobs can reach it.

    Called by the core when it opens its first listening endpoint. First non-None
    result wins. The local backend answers ``127.0.0.1``, Kubernetes the pod IP,
    Docker in bridge mode the gateway address. Listeners bind this address only
    (not all interfaces) unless ``listen_host``/``bind_host`` is configured.

    :param config: the effective configuration (the backend's own keys included).
    :return: an address (IP or host name) jobs of this backend can connect to, or None
        when this plugin is not the selected backend.
    """


@hookspec(firstresult=True)
def fiber_create_job(spec: JobSpec, config: ConfigView) -> Job | None:
    """Start a job that runs ``spec.argv(<the interpreter where it runs>)`` with ``spec.env``.

    Called by the core when a job-backed :class:`~fibercore.Process` starts (and so
    for every Pool worker, manager server and Ring member). First non-None wins.

    Must return without waiting for the job to run: the core waits for the worker
    to connect back, with a timeout, and reports the job's status and logs if it
    never does. Must deliver ``spec.secret_env`` by the safest means the backend has
    and never log it. Labels in ``spec.labels`` (always the session id) must be
    attached to the job so that ``fiber_cleanup_jobs`` can find it. Must not change
    ``spec``: the command line it really runs goes in ``Job.command``.

    :param spec: what to run; see :class:`fibercore.types.JobSpec`.
    :param config: the effective configuration (the backend's own keys included).
    :return: a :class:`fibercore.types.Job` handle.
    :raises Exception: with a message that says what to fix (missing image, bad
        credentials); the core wraps it in a ``ProcessError``.
    """


@hookspec(firstresult=True)
def fiber_job_status(job: Job, config: ConfigView) -> JobStatus | None:
    """Return the job's :class:`~fibercore.types.JobStatus`.

    Called by the core while waiting for a job to connect and by ``is_alive()``.
    First non-None wins. Should be cheap; backends with remote APIs cache or batch.

    :param job: a handle this backend's ``fiber_create_job`` returned.
    :param config: the effective configuration.
    :return: the job's state (``exitcode`` set once it ended), or None when ``job`` is
        not this backend's.
    """


@hookspec(firstresult=True)
def fiber_wait_job(job: Job, timeout: float | None, config: ConfigView) -> int | None:
    """Wait up to ``timeout`` seconds (None: forever) for the job to finish.

    Called by ``Process.join()`` and by the core's exit watchers. First non-None
    wins, so a backend that times out returns None and the core treats it as "still
    running".

    :param job: a handle this backend's ``fiber_create_job`` returned.
    :param timeout: seconds to wait at most; None: until the job ends.
    :param config: the effective configuration.
    :return: the exit code, using multiprocessing's convention (negative signal
        number when the job was killed by a signal), or None on timeout.
    """


@hookspec(firstresult=True)
def fiber_terminate_job(job: Job, force: bool, config: ConfigView) -> bool | None:
    """Stop the job. Idempotent: a job already gone is not an error.

    Called by ``Process.terminate()`` (``force=False``, SIGTERM where possible),
    ``Process.kill()`` (``force=True``, SIGKILL) and at session cleanup.

    :param job: a handle this backend's ``fiber_create_job`` returned.
    :param force: True: kill at once (SIGKILL); False: ask it to stop (SIGTERM).
    :param config: the effective configuration.
    :return: True when handled (so later plugins are not asked).
    """


@hookspec(firstresult=True)
def fiber_job_logs(job: Job, config: ConfigView) -> str | None:
    """Return what the job printed, as far as the backend can tell.

    Called when a job fails to start or dies unexpectedly, to put its output in the
    error. First non-None wins. Return a short explanation when no logs exist yet.

    :param job: a handle this backend's ``fiber_create_job`` returned.
    :param config: the effective configuration.
    :return: the job's output (its end matters most: the core quotes the last few
        thousand characters), or None when ``job`` is not this backend's.
    """


@hookspec(firstresult=True)
def fiber_cleanup_jobs(session: str | None, config: ConfigView) -> int | None:
    """Remove jobs left behind by a session.

    Called by ``fiber cleanup`` and by ``fiber run`` when its master ended. Uses the
    session label every job carries. First non-None wins.

    :param session: a session id: stop and remove every job of that session. None: the jobs
        of every session whose master is gone, by the rule of
        :func:`fibercore.backendkit.sessions_to_clean` (every job carries
        ``backendkit.MASTER_LABEL``); a running program's jobs are never touched.
    :param config: the effective configuration.
    :return: how many jobs were stopped or removed, or None when this plugin is not the
        selected backend.
    """


@hookspec(firstresult=True)
def fiber_job_secret(session: str, config: ConfigView) -> str | None:
    """Return the session secret (hex) in a job whose backend delivered it by its own means.

    Called in a job at start-up, after plugins are loaded and the config is built, only
    when neither ``FIBER_SECRET`` nor ``FIBER_SECRET_FILE`` is set: a backend that put
    the secret in a secret store (AWS SSM, a vault) fetches it here. First non-None wins.
    Must not log the secret.

    :param session: the job's session id (``FIBER_SESSION``).
    :param config: the job's effective configuration.
    :return: the secret as hex, or None when this backend did not deliver it.
    :raises Exception: with a message that says what to fix (missing permission...).
    """


# ---------------------------------------------------------------------------
# Operations: what the ``fiber`` command asks a backend, from any process (optional)
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def fiber_list_jobs(session: str | None, config: ConfigView) -> list[JobInfo] | None:
    """List the jobs of ``session`` (None: of every fiber session) on this backend.

    Called by ``fiber ps`` and ``fiber logs SESSION``, usually in a process that did not
    start the jobs: the backend finds them by the ``fiber-session`` label every job
    carries (containers, pods, Batch tags, a local process's environment). First
    non-None wins; a backend without it makes ``fiber ps`` say so.

    :param session: a session id, or None for every session this backend can see.
    :param config: the effective configuration.
    :return: :class:`fibercore.types.JobInfo` records, finished jobs the backend still
        knows included.
    """


@hookspec(firstresult=True)
def fiber_read_job_logs(jid: str, config: ConfigView) -> str | None:
    """Return the output of job ``jid`` (a :attr:`JobInfo.jid`), from any process.

    Called by ``fiber logs JOB``. First non-None wins. Return None when the job is
    not this backend's; raise with a clear message when it is but its logs are gone.

    :param jid: the job id ``fiber ps`` showed (:attr:`fibercore.types.JobInfo.jid`).
    :param config: the effective configuration.
    :return: the job's output so far, or None.
    """


@hookspec(firstresult=True)
def fiber_follow_logs(job: Job, config: ConfigView) -> Iterator[str] | None:
    """Return an iterator over the job's output as it is printed, ending when the job ends.

    Called by ``fiber run`` to stream the output of the master it started. A backend
    that already echoes each job's output to the creating process (local, docker)
    need not implement it; ``fiber run`` then relies on the echo.

    :param job: a handle this backend's ``fiber_create_job`` returned.
    :param config: the effective configuration.
    :return: an iterator of text chunks, or None when this backend does not stream.
    """


@hookspec(firstresult=True)
def fiber_copy_files(jid: str, source: str, destination: str, into_job: bool,
                     config: ConfigView) -> bool | None:
    """Copy a file or directory into a job (``into_job``) or out of it.

    Called by ``fiber cp``. A path inside the job is relative to its working
    directory. First non-None wins.

    :param jid: the job id ``fiber ps`` showed.
    :param source: the path to copy (inside the job when ``into_job`` is False).
    :param destination: where it goes (inside the job when ``into_job`` is True).
    :param into_job: the direction: True copies from here into the job.
    :param config: the effective configuration.
    :return: True when done, None when the job is not this backend's.
    :raises Exception: with the reason (and the fix) when the job's files are out of reach.
    """


@hookspec(firstresult=True)
def fiber_job_usage(job: Job, config: ConfigView) -> JobUsage | None:
    """Return what a running job uses now: CPU time so far and resident memory.

    Called in the master about once a second per job, only while ``fiber top`` or the
    dashboard is looking (see :mod:`fibercore.observe`); must be quick (no call that takes
    a second, such as a container engine's stats stream). First non-None wins; a backend
    that cannot tell leaves it out, and the views show "-".

    :param job: a handle this backend's ``fiber_create_job`` returned.
    :param config: the effective configuration.
    :return: a :class:`fibercore.types.JobUsage` (fields it cannot tell None), or None when
        ``job`` is not this backend's or has ended.
    """


@hookspec
def fiber_doctor(config: ConfigView) -> list[Check]:
    """Check what this plugin needs (engine reachable, credentials, image present).

    Called by ``fiber doctor`` for every installed backend, with that backend's
    configuration. Each :class:`fibercore.types.Check` says what was checked, whether
    it holds, and for each "no" the fix. Must be quick (a few seconds at most) and must
    not start jobs. Results of every plugin are concatenated.

    :param config: the configuration with this backend selected.
    :return: the checks, in the order to show them.
    """


# ---------------------------------------------------------------------------
# Transport and serialization (first provider wins; built-ins are trylast)
# ---------------------------------------------------------------------------


@hookspec(firstresult=True)
def fiber_transport(config: ConfigView) -> Transport | None:
    """Provide the transport that moves frames between processes.

    Called once per process by the core, which keeps the result; hot paths call the
    transport object, never this hook. The built-in TCP transport
    (:mod:`fibercore.builtins.tcp_transport`) is registered ``trylast``, so any
    other provider replaces it. A transport must run the core's handshake on every
    connection before reporting it (see :mod:`fibercore.transport`).

    :param config: the effective configuration (TLS settings, ``transport``...).
    :return: an object implementing :class:`fibercore.transport.Transport`, or None to
        leave the choice to a later provider.
    """


@hookspec(firstresult=True)
def fiber_serializer(config: ConfigView) -> Serializer | None:
    """Provide the serializer for objects sent between processes.

    Called once per process by the core. Built-in: cloudpickle with pickle protocol
    5 out-of-band buffers (registered ``trylast``). Deserialization only ever
    happens after a frame has been authenticated by the core. First non-None wins.

    :param config: the effective configuration (``share_arrays_from``...).
    :return: an object implementing :class:`fibercore.serialization.Serializer`, or None.
    """


# ---------------------------------------------------------------------------
# Observers (every plugin; results ignored)
# ---------------------------------------------------------------------------


@hookspec
def fiber_job_started(job: Job, spec: JobSpec) -> None:
    """Called in the master after ``fiber_create_job`` returned ``job``, on every plugin;
    its results are ignored.

    :param job: the handle the backend returned.
    :param spec: what the job runs (its secret included: never log ``spec.secret_env``).
    """


@hookspec
def fiber_job_exited(job: Job, exitcode: int | None) -> None:
    """Called in the master once it knows that ``job`` has ended, on every plugin; its
    results are ignored.

    :param job: the handle the backend returned.
    :param exitcode: multiprocessing's convention (negative: killed by that signal), or
        None when it cannot be told.
    """


@hookspec
def fiber_worker_start(config: ConfigView) -> None:
    """Called in a worker after it authenticated, before user code runs, on every plugin;
    results are ignored.

    :param config: the worker's effective configuration.
    """
