"""Plugin discovery, backend selection and the typed facade over pluggy.

Entry-point groups:

``fiber.backends``
    one entry point per backend; its name is the ``FIBER_BACKEND`` value, its value the
    plugin: a module, or an object (``aws = "fiber_aws.plugin:plugin"``, an
    :class:`fibercore.backendkit.EngineBackend`). Only the selected backend is imported.
``fiber.plugins``
    extensions that are always loaded (a transport, a serializer, an observer),
    unless ``FIBER_DISABLE_PLUGIN_AUTOLOAD`` is set.

Backend selection, first that applies (docs/configuration.md)::

    fibercore.init(backend=) > FIBER_BACKEND > config file > fiber_detect_backend() > local

Every plugin may declare the hook contract it was written for (``FIBER_CONTRACT = 3``
in its module); a declared version this core does not speak is refused at load time
with the fix (see :mod:`fibercore.hookspecs`).

Switches: ``FIBER_DISABLE_PLUGIN_AUTOLOAD`` (no ``fiber.plugins``, no detection),
``FIBER_PLUGINS=mod1,mod2:obj`` (import and register these modules or objects; jobs too),
``FIBER_TRACE_HOOKS`` (log every hook call to stderr), ``FIBERCORE_RECORD_HOOKS=DIR`` (each
process writes the name of every hook it calls to a file in DIR: the test suite's check that
every hook is really called, tests/test_hooks_called.py).

The rest of the core calls :class:`Plugins` methods, never ``pm.hook`` directly.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from fibercore import hookspecs
from fibercore.errors import BackendNotFoundError, ConfigError, ProcessError
from fibercore.types import Check, Job, JobInfo, JobSpec, JobStatus, JobUsage, Option
from fibercore.util import truthy_env

log = logging.getLogger("fibercore.plugins")

#: Hooks whose result is a secret: traced as "<secret>".
_SECRET_HOOKS = frozenset({"fiber_job_secret"})
#: Text never written by the hook tracer (the session secret, as hex and as bytes' repr).
_REDACT: set[str] = set()


def redact(secret: bytes) -> None:
    """Never show ``secret`` in hook traces."""
    _REDACT.update({secret.hex(), repr(secret)[2:-1]})


BACKENDS_GROUP = "fiber.backends"
PLUGINS_GROUP = "fiber.plugins"

#: Built-in behaviour, registered like any other plugin (and so replaceable).
DEFAULT_PLUGINS: tuple[str, ...] = (
    "fibercore.builtins.tcp_transport",
    "fibercore.builtins.cloudpickle_serializer",
)

#: This project's backend distributions by backend name (aliases too), for install hints.
KNOWN_DISTRIBUTIONS = {
    "local": "fiber-local",
    "docker": "fiber-docker",
    "kubernetes": "fiber-k8s",
    "k8s": "fiber-k8s",
    "aws": "fiber-aws",
    "slurm": "fiber-slurm",
    "ssh": "fiber-ssh",
}


def install_hint(distribution: str) -> str:
    """How to install one of this project's distributions. None is on a package index yet:
    from a checkout, or from the wheels ``scripts/wheels`` builds into ``dist/``."""
    folder = "plugins/" + distribution.replace("-", "_")
    return (f"pip install -e {folder} in a fibercore checkout, or pip install {distribution} "
            f"--find-links dist/ after scripts/wheels (fibercore is not on a package index yet)")


@dataclass(frozen=True)
class EntryPointInfo:
    """An installed plugin as its metadata describes it (nothing imported)."""

    group: str
    name: str
    value: str
    distribution: str
    version: str


def installed(group: str) -> list[EntryPointInfo]:
    """Entry points of ``group``, read from metadata without importing them."""
    from importlib import metadata

    out = []
    for ep in metadata.entry_points(group=group):
        dist = getattr(ep, "dist", None)
        out.append(
            EntryPointInfo(
                group,
                ep.name,
                ep.value,
                dist.metadata["Name"] if dist is not None else "?",
                dist.version if dist is not None else "?",
            )
        )
    return sorted(out, key=lambda e: e.name)


def installed_backends() -> list[str]:
    return sorted({e.name for e in installed(BACKENDS_GROUP)})


def backends_by_module() -> list[tuple[EntryPointInfo, list[str]]]:
    """Each installed backend once (the first of its names), with its other names (aliases:
    entry points of the same distribution that load the same module)."""
    groups: dict[tuple[str, str], list[EntryPointInfo]] = {}
    for info in installed(BACKENDS_GROUP):
        groups.setdefault((info.distribution, info.value.strip()), []).append(info)
    out = []
    for infos in groups.values():
        # The name the distribution is known by comes first (kubernetes before k8s).
        infos.sort(key=lambda i: (KNOWN_DISTRIBUTIONS.get(i.name) != i.distribution, -len(i.name), i.name))
        out.append((infos[0], [i.name for i in infos[1:]]))
    return sorted(out, key=lambda pair: pair[0].name)


def unknown_backend_message(name: str) -> str:
    """One line: the installed backends, the closest name, and how to install a known one."""
    import difflib

    names = installed_backends()
    have = ", ".join(names) or "none"
    text = f"unknown fibercore backend {name!r} (installed: {have})"
    close = difflib.get_close_matches(name.lower(), names, n=1, cutoff=0.6)
    if close:
        return f"{text}: did you mean {close[0]!r}? Set FIBER_BACKEND (or backend=) to it."
    dist = KNOWN_DISTRIBUTIONS.get(name.lower())
    if dist is not None:
        return f"{text}: the {name!r} backend is the {dist} distribution; install it: {install_hint(dist)}."
    return (f"{text}: set FIBER_BACKEND (or backend=) to one of them; a third-party backend "
            f"named {name!r} must be installed first (`fiber backends` lists what is).")


def load_value(value: str) -> Any:
    """Import ``module`` or ``module:attribute`` (an entry point's value)."""
    module_name, _, attr = value.partition(":")
    obj: Any = importlib.import_module(module_name.strip())
    for part in filter(None, attr.strip().split(".")):
        obj = getattr(obj, part)
    return obj


def _load_entry_point(group: str, name: str) -> tuple[Any, str]:
    from importlib import metadata

    for ep in metadata.entry_points(group=group):
        if ep.name == name:
            try:
                return ep.load(), ep.value
            except Exception as exc:
                raise ConfigError(
                    f"the {group} plugin {name!r} ({ep.value}) failed to import: "
                    f"{type(exc).__name__}: {exc}. Reinstall it or set another backend."
                ) from exc
    raise BackendNotFoundError(unknown_backend_message(name))


def declared_contract(plugin: Any) -> int | None:
    """The hook contract version ``plugin`` declares (``FIBER_CONTRACT``), or None."""
    value = getattr(plugin, "FIBER_CONTRACT", None)
    return value if isinstance(value, int) else None


def check_contract(plugin: Any, name: str) -> None:
    """Refuse a plugin written for a hook contract this core does not speak."""
    version = declared_contract(plugin)
    if version is None:
        return
    low, high = hookspecs.MIN_CONTRACT_VERSION, hookspecs.CONTRACT_VERSION
    if version > high:
        raise ConfigError(
            f"plugin {name!r} is written for fibercore hook contract {version}, but this fibercore "
            f"speaks contract {high}: upgrade fibercore (pip install -U fibercore), or install a "
            "release of the plugin made for this one."
        )
    if version < low:
        raise ConfigError(
            f"plugin {name!r} is written for fibercore hook contract {version}, which this fibercore "
            f"no longer loads (it speaks {low}..{high}): upgrade the plugin, or pin an older "
            "fibercore. docs/writing-a-backend.md lists what changed."
        )


def _register(pm: pluggy.PluginManager, plugin: Any, name: str | None = None) -> None:
    """Register ``plugin`` once, after checking its declared contract."""
    if pm.is_registered(plugin):
        return
    check_contract(plugin, name or str(getattr(plugin, "__name__", repr(plugin))))
    pm.register(plugin, name=name)


def new_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    for modname in DEFAULT_PLUGINS:
        module = importlib.import_module(modname)
        _register(pm, getattr(module, "plugin", module), modname)
    return pm


_recorded: set[str] = set()


def record_calls(pm: pluggy.PluginManager) -> None:
    """With ``FIBERCORE_RECORD_HOOKS=DIR``: write each hook name this process calls (the first
    time) to its own file in DIR."""
    directory = os.environ.get("FIBERCORE_RECORD_HOOKS")
    if not directory:
        return
    path = os.path.join(directory, f"{os.getpid()}-{os.urandom(4).hex()}")

    def before(name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
        if name not in _recorded:
            _recorded.add(name)
            try:
                with open(path, "a") as fh:
                    fh.write(name + "\n")
            except OSError:  # the directory is gone (the suite ended): nothing to record
                pass

    pm.add_hookcall_monitoring(before, lambda *args: None)


def detect_backend() -> str | None:
    """Ask every installed backend (imported cheaply) whether the environment calls for it."""
    pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    record_calls(pm)
    for info in installed(BACKENDS_GROUP):
        try:
            plugin = load_value(info.value)
        except Exception as exc:  # a broken plugin must not break detection
            log.debug("backend %s not importable for detection: %s", info.name, exc)
            continue
        if pm.is_registered(plugin):
            continue
        pm.register(plugin, name=f"{BACKENDS_GROUP}:{info.name}")
    for answer in pm.hook.fiber_detect_backend():
        if answer:
            return str(answer)
    return None


class Plugins:
    """Typed facade over the plugin manager; what the rest of the core calls."""

    def __init__(self, pm: pluggy.PluginManager, backend: str) -> None:
        self.pm = pm
        self.backend = backend
        #: Entry point values of the loaded plugins; jobs import exactly these.
        self.modules: list[str] = []
        #: The effective configuration, handed to every job hook (set by the runtime once
        #: it is built: the configuration depends on the plugins' options).
        self.config: Any = None
        self._undo_trace: Callable[[], None] | None = None

    # -- construction --------------------------------------------------------------
    @classmethod
    def load(cls, backend: str, extra: Iterable[Any] = ()) -> Plugins:
        pm = new_plugin_manager()
        values: list[str] = []  # what a job must import to have the same plugins
        resolved = os.environ.get("FIBER_PLUGIN_MODULES")
        if resolved is not None and backend != os.environ.get("FIBER_BACKEND"):
            resolved = None  # a job that switched backends looks them up itself
        if resolved is not None:
            # In a job: the master resolved the entry points already; importing the
            # modules directly skips reading every distribution's metadata.
            for value in filter(None, resolved.split(",")):
                _register(pm, load_value(value), value)
                values.append(value)
        elif not truthy_env("FIBER_DISABLE_PLUGIN_AUTOLOAD"):
            for info in installed(PLUGINS_GROUP):
                try:
                    obj = load_value(info.value)
                except Exception as exc:
                    raise ConfigError(
                        f"the {PLUGINS_GROUP} plugin {info.name!r} ({info.value}) from "
                        f"{info.distribution} failed to import: {type(exc).__name__}: {exc}. "
                        "Reinstall or uninstall it."
                    ) from exc
                _register(pm, obj, f"{PLUGINS_GROUP}:{info.name}")
                values.append(info.value)
        for value in filter(None, (v.strip() for v in os.environ.get("FIBER_PLUGINS", "").split(","))):
            _register(pm, load_value(value), value)  # a module, or module:object
            if value not in values:
                values.append(value)
        for obj in extra:
            _register(pm, obj)
        if resolved is None:
            backend_plugin, value = _load_entry_point(BACKENDS_GROUP, backend)
            _register(pm, backend_plugin, f"{BACKENDS_GROUP}:{backend}")
            values.append(value)
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise ConfigError(
                f"plugin {exc.plugin!r} implements a hook fibercore does not define: {exc}. "
                "Check the spelling against fibercore.hookspecs (hooks start with `fiber_`)."
            ) from exc
        self = cls(pm, backend)
        self.modules = values
        record_calls(pm)
        if truthy_env("FIBER_TRACE_HOOKS"):
            self.enable_tracing()
        return self

    def enable_tracing(self, write: Any = None) -> None:
        """Log every hook call and result; secrets (see :func:`redact`) never appear."""
        raw = write or (lambda text: sys.stderr.write(text))

        def out(text: str) -> None:
            for secret in _REDACT:
                text = text.replace(secret, "<secret>")
            raw(text)

        def before(name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
            args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
            out(f"[fiber hook] {name}({args}) -> {[i.plugin_name for i in impls]}\n")

        def after(outcome: Any, name: str, impls: Any, kwargs: Mapping[str, Any]) -> None:
            try:
                result = outcome.get_result()
            except BaseException as exc:
                result = f"raised {exc!r}"
            shown = "<secret>" if name in _SECRET_HOOKS and result else repr(result)
            out(f"[fiber hook] {name} returned {shown}\n")

        self._undo_trace = self.pm.add_hookcall_monitoring(before, after)

    def disable_tracing(self) -> None:
        """Stop what :meth:`enable_tracing` started."""
        if self._undo_trace is not None:
            self._undo_trace()
            self._undo_trace = None

    # -- discovery and configuration ---------------------------------------------------
    def config_options(self) -> list[Option]:
        options: list[Option] = []
        for impl, result in zip(
            reversed(self.pm.hook.fiber_config_options.get_hookimpls()),
            self.pm.hook.fiber_config_options(), strict=False,
        ):
            for opt in result or ():
                if opt.plugin == "fibercore":
                    opt = Option(opt.name, opt.type, opt.default, opt.help, opt.choices, impl.plugin_name)
                options.append(opt)
        return options

    # -- jobs -------------------------------------------------------------------------
    def listen_host(self) -> str:
        return self.pm.hook.fiber_listen_host(config=self.config) or "127.0.0.1"

    def config_defaults(self) -> dict[str, Any]:
        """The backend's preferred values for core keys (``fiber_config_defaults``)."""
        merged: dict[str, Any] = {}
        for answer in reversed(self.pm.hook.fiber_config_defaults()):
            if answer:
                merged.update(answer)
        return merged

    def job_secret(self, session: str, config: Any) -> str | None:
        return self.pm.hook.fiber_job_secret(session=session, config=config)

    def create_job(self, spec: JobSpec) -> Job:
        job = self.pm.hook.fiber_create_job(spec=spec, config=self.config)
        if job is None:
            raise ProcessError(
                f"backend {self.backend!r} did not create a job for {spec.name!r}: no plugin "
                "implements fiber_create_job. Is the backend plugin complete?"
            )
        self.pm.hook.fiber_job_started(job=job, spec=spec)
        return job

    def job_status(self, job: Job) -> JobStatus:
        return self.pm.hook.fiber_job_status(job=job, config=self.config) or JobStatus.UNKNOWN

    def wait_job(self, job: Job, timeout: float | None) -> int | None:
        return self.pm.hook.fiber_wait_job(job=job, timeout=timeout, config=self.config)

    def terminate_job(self, job: Job, force: bool = False) -> None:
        self.pm.hook.fiber_terminate_job(job=job, force=force, config=self.config)

    def job_logs(self, job: Job) -> str:
        try:
            logs = self.pm.hook.fiber_job_logs(job=job, config=self.config)
        except Exception as exc:  # logs are for diagnosis; never mask the real error
            return f"(logs unavailable: {type(exc).__name__}: {exc})"
        return logs if logs is not None else "(the backend keeps no logs for this job)"

    def cleanup_jobs(self, session: str | None) -> int:
        return self.pm.hook.fiber_cleanup_jobs(session=session, config=self.config) or 0

    # -- operations (the fiber command) ------------------------------------------------------
    def _unsupported(self, hook: str, command: str) -> ConfigError:
        return ConfigError(
            f"backend {self.backend!r} does not implement {hook}, which `fiber {command}` needs; "
            "upgrade its plugin, or ask its authors to implement the hook (docs/hooks.md)"
        )

    def list_jobs(self, session: str | None) -> list[JobInfo]:
        found = self.pm.hook.fiber_list_jobs(session=session, config=self.config)
        if found is None:
            raise self._unsupported("fiber_list_jobs", "ps")
        return list(found)

    def read_job_logs(self, jid: str) -> str:
        text = self.pm.hook.fiber_read_job_logs(jid=jid, config=self.config)
        if text is None:
            if not self.pm.hook.fiber_read_job_logs.get_hookimpls():
                raise self._unsupported("fiber_read_job_logs", "logs")
            raise ConfigError(f"no job {jid!r} on backend {self.backend!r}: `fiber ps` lists the jobs and their ids")
        return text

    def follow_logs(self, job: Job) -> Iterator[str] | None:
        """The job's output as it is printed, or None: the backend echoes it already."""
        return self.pm.hook.fiber_follow_logs(job=job, config=self.config)

    def copy_files(self, jid: str, source: str, destination: str, into_job: bool) -> None:
        done = self.pm.hook.fiber_copy_files(jid=jid, source=source, destination=destination,
                                             into_job=into_job, config=self.config)
        if done is None:
            if not self.pm.hook.fiber_copy_files.get_hookimpls():
                raise self._unsupported("fiber_copy_files", "cp")
            raise ConfigError(f"no job {jid!r} on backend {self.backend!r}: `fiber ps` lists the jobs and their ids")

    def job_usage(self, job: Job) -> JobUsage | None:
        """CPU time and memory of a running job where the backend can tell (None: it cannot)."""
        try:
            return self.pm.hook.fiber_job_usage(job=job, config=self.config)
        except Exception:  # a reading for a view: never an error of the program's
            return None

    def doctor(self) -> list[Check]:
        return [check for answer in self.pm.hook.fiber_doctor(config=self.config) for check in answer or ()]

    # -- transport and serialization ------------------------------------------------------
    def transport(self, config: Any) -> Any:
        return self.pm.hook.fiber_transport(config=config)

    def serializer(self, config: Any) -> Any:
        return self.pm.hook.fiber_serializer(config=config)

    # -- observers ---------------------------------------------------------------------
    def job_exited(self, job: Job, exitcode: int | None) -> None:
        self.pm.hook.fiber_job_exited(job=job, exitcode=exitcode)

    def worker_start(self, config: Any) -> None:
        self.pm.hook.fiber_worker_start(config=config)

    # -- introspection ------------------------------------------------------------------
    def describe(self) -> list[tuple[str, list[str]]]:
        """(plugin name, hooks it implements) for every registered plugin."""
        out = []
        for name, plugin in self.pm.list_name_plugin():
            hooks = [h.name for h in self.pm.get_hookcallers(plugin) or []]
            out.append((name, sorted(hooks)))
        return out

    def contract_of(self, name: str) -> int | None:
        """The hook contract the registered plugin ``name`` declares (None: undeclared)."""
        return declared_contract(self.pm.get_plugin(name))
