"""Typed, validated configuration (docs/configuration.md).

Precedence, lowest first::

    Option defaults  <  .fiberconfig ([default], as the original fiber) or
                        [tool.fiber] in pyproject.toml (current directory)
                     <  FIBER_<KEY> environment variables
                     <  fibercore.init(key=value)

Keys are declared as :class:`~fibercore.types.Option` by the core and by plugins
(``fiber_config_options``). Values are converted to the declared type
(``FIBER_DEBUG=false`` is False). An unknown key in a file or in ``init()`` is an
error that lists the valid keys; an unknown ``FIBER_*`` variable only warns, since
the environment is shared with other programs.
"""

from __future__ import annotations

import configparser
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fibercore.errors import ConfigError
from fibercore.types import Option

log = logging.getLogger("fibercore.config")

_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class LogLevel(str):
    """A level's name (``"info"``) that also equals its number (``logging.INFO``), as the
    original fiber's ``config.log_level`` was the number."""

    def __eq__(self, other: object) -> bool:
        if isinstance(other, int) and not isinstance(other, bool):
            return logging.getLevelName(self.upper()) == other
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = str.__hash__


def _log_level(value: Any) -> str:
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        return LogLevel(logging.getLevelName(int(value)).lower())
    text = str(value).strip().lower()
    if text not in _LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(_LOG_LEVELS)} or a number; got {value!r}")
    return LogLevel(text)


_log_level.__name__ = "log level"

CORE_OPTIONS: tuple[Option, ...] = (
    Option("backend", str, None, "Backend that runs jobs (an installed fiber.backends entry point)."),
    Option("default_backend", str, "local", "Backend used when nothing selects or detects one."),
    Option("debug", bool, False, "Verbose logging in the master and the workers."),
    Option("log_level", _log_level, "warning", "Logging level of fibercore's loggers."),
    Option("log_file", str, None, "Write fibercore's log here (default: stderr)."),
    Option("image", str, None, "Container image for jobs (container backends)."),
    Option("default_image", str, None, "Image used when `image` is not set (container backends)."),
    Option("cpu_per_job", float, None, "CPUs requested per job unless @meta says otherwise."),
    Option("mem_per_job", int, None, "Memory (MiB) requested per job unless @meta says otherwise."),
    Option("gpu_per_job", int, None, "GPUs requested per job unless @meta says otherwise."),
    Option("python_exe", str, None, "Interpreter that runs the worker (default: this one locally, `python3` in "
                                    "images)."),
    Option("listen_host", str, None, "Address advertised to jobs (default: the backend's answer)."),
    Option("bind_host", str, None, "Address listeners bind (default: listen_host; never all interfaces unless set)."),
    Option("ipc_admin_master_port", int, 0, "Kept for compatibility with fiber; ports are chosen by the OS."),
    Option("start_timeout", float, 120.0, "Seconds Process.start() waits for the job to connect back."),
    Option("heartbeat_interval", float, 2.0, "Seconds between heartbeats between the master and its workers on "
                                             "other machines (each way)."),
    Option("heartbeat_timeout", float, 20.0, "The bound for silence across machines: a worker exits when its master "
                                             "is silent this long, the master declares a silent worker lost (its "
                                             "tasks rerun), and a TCP connection to a silent peer closes "
                                             "(docs/cluster.md)."),
    Option("pool_processes", int, None, "Workers of a Pool created with processes=None (default: the backend's, else "
                                        "the CPU count)."),
    Option("pool_start_concurrency", int, 0, "Jobs a Pool starts at once, the next when one is ready (0: all at "
                                             "once)."),
    Option("pool_progress", bool, False, "Show a tqdm progress bar for every Pool map/imap (or pass progress=True to "
                                         "one call)."),
    Option("pool_max_task_retries", int, 3, "Times a Pool task is rerun after its worker died before it fails."),
    Option("pool_max_error_retries", int, 10, "With Pool(error_handling=True): times a task whose function raised "
                                              "is rerun before its exception is the result."),
    Option("transport", str, "tcp", "Which transport carries frames: tcp (the built-in: TCP, Unix sockets on one "
                                    "machine, TLS with tls = true) or the name a transport plugin answers to."),
    Option("network_encryption", bool, True,
           "Encrypt frames between machines (AES-256-GCM). False: they are still authenticated "
           "(AES-GMAC), counted and bound to their connection, but readable on the network: large "
           "transfers cost less; only on a network you trust. Every process of a program must agree."),
    Option("tls", bool, False, "Run every endpoint over tls+tcp (needs tls_cert_file and tls_ca_file)."),
    Option("tls_cert_file", str, None, "PEM file with this process's certificate and key."),
    Option("tls_ca_file", str, None, "PEM file of the CA that signed every peer's certificate."),
    Option("tls_server_name", str, None, "Name every listener's certificate must carry (default: the host of the "
                                         "address dialled)."),
    Option("handshake_timeout", float, 10.0, "Seconds a new connection has to authenticate before it is closed."),
    Option("max_pending_connections", int, 64, "Unauthenticated connections an endpoint holds (more are refused; "
                                               "diallers retry)."),
    Option("max_pending_per_peer", int, 32, "Unauthenticated connections one peer (a uid on Unix, an address on TCP) "
                                            "may hold on an endpoint."),
    Option("max_connections", int, 4096, "Authenticated connections an endpoint accepts."),
    Option("max_frame_size", int, 1 << 30, "Largest frame (bytes) an authenticated peer may send; bigger objects fail "
                                           "with a clear error."),
    Option("spin_wait", float, 0.0, "Microseconds a waiting read may poll before it sleeps (0, the default: never "
                                    "poll). 200 halves a 1:1 round trip when every process has a CPU of its own; with "
                                    "more processes than CPUs it costs steps (see docs/performance.md)."),
    Option("share_arrays_from", int, 1 << 20, "numpy arrays of at least this many bytes in a Pool's initargs, or in "
                                              "the __main__ globals a task's function uses, are kept once per machine "
                                              "in shared memory and mapped copy-on-write by each job (0: never)."),
    Option("queue_max_bytes", int, 256 << 20, "Bytes a queue's broker holds before put() blocks, as on a full queue."),
    Option("dashboard", bool, False, "Serve the web dashboard of this program (needs fibercore[dashboard]); its URL, "
                                     "with the token it requires, is printed when it starts."),
    Option("dashboard_host", str, "127.0.0.1", "Address the dashboard binds (another than 127.0.0.1 only on purpose: "
                                               "anyone who can reach it and has the token sees the program)."),
    Option("dashboard_port", int, 0, "Port of the dashboard (0: one the OS chooses)."),
)

#: Keys the original fiber accepted that have no effect here (accepted, warned).
LEGACY_KEYS: dict[str, str] = {
    "use_push_queue": "queues are always broker-backed",
    "ipc_active": "workers always connect to the master",
    "ipc_admin_worker_port": "workers do not listen for the master",
    "merge_output": "use fibercore.Process logs or the backend's log command",
    "use_bash": "commands are always run without a shell",
}
#: Their types and the original fiber's defaults: readable as before (``config.ipc_active``).
LEGACY_OPTIONS: dict[str, Option] = {
    "use_push_queue": Option("use_push_queue", bool, True, LEGACY_KEYS["use_push_queue"]),
    "ipc_active": Option("ipc_active", bool, True, LEGACY_KEYS["ipc_active"]),
    "ipc_admin_worker_port": Option("ipc_admin_worker_port", int, 8000, LEGACY_KEYS["ipc_admin_worker_port"]),
    "merge_output": Option("merge_output", bool, False, LEGACY_KEYS["merge_output"]),
    "use_bash": Option("use_bash", bool, False, LEGACY_KEYS["use_bash"]),
}

#: FIBER_* variables that are switches or worker plumbing, not config keys.
ENV_SWITCHES = frozenset(
    {
        "FIBER_DISABLE_PLUGIN_AUTOLOAD",
        "FIBER_TRACE_HOOKS",
        "FIBER_PLUGINS",
        "FIBER_SESSION",
        "FIBER_SECRET",
        "FIBER_SECRET_FILE",
        "FIBER_SECRET_FD",
        "FIBER_STATUS_DIR",
        "FIBER_TEST_BURN",
        "FIBER_MASTER_ADDR",
        "FIBER_TOKEN",
        "FIBER_CONFIG_FILE",
        "FIBER_PLUGIN_MODULES",
        "FIBER_MASTER_PYTHON",
        # The checkout's scripts (scripts/run, scripts/test):
        "FIBER_VENV",
        "FIBER_DRIFT_VENV",
        "FIBER_SKIP_K8S_BUILD",
    }
)


#: Keys that describe where *this* process listens: a job runs elsewhere (a container,
#: a pod, another host) and asks its backend for its own address instead.
PER_PROCESS_KEYS = frozenset({"listen_host", "bind_host"})


class Config(Mapping[str, Any]):
    """The effective configuration: read-only, typed, with the origin of each value.

    ``Config(conf_file="my.ini")`` is the original fiber's constructor: the defaults, that
    INI file's ``[default]`` section, then ``FIBER_*`` variables (an unknown key in the file
    raises ``ValueError``). fibercore itself builds one from every source (see the module).
    """

    _options: dict[str, Option]
    _values: dict[str, Any]
    _origins: dict[str, str]
    _legacy: dict[str, Any]

    def __init__(self, options: dict[str, Option] | None = None, values: dict[str, Any] | None = None,
                 origins: dict[str, str] | None = None, *, conf_file: str | os.PathLike[str] | None = None,
                 legacy: dict[str, Any] | None = None):
        if options is None:  # fiber's Config(conf_file=...)
            built = _from_file(conf_file)
            options, values, origins, legacy = built._options, built._values, built._origins, built._legacy
        self._options = options
        self._values = values or {}
        self._origins = origins or {}
        self._legacy = legacy or {}

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The typed value of ``key`` (``default`` when it has none)."""
        return self._values.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        try:
            return self._values[key]
        except KeyError:
            if key in LEGACY_OPTIONS:
                return self._legacy.get(key, LEGACY_OPTIONS[key].default)
            raise AttributeError(unknown_key_message(key, self._options)) from None

    def select_backend(self, name: str) -> None:
        """Record the backend that was selected (by detection or the default) when no source
        named one, so ``backend`` reads the same in the master and in its jobs."""
        if self._values.get("backend") is None:
            self._values["backend"] = name
            self._origins.setdefault("backend", "selected: detection or default_backend")

    def origin(self, key: str) -> str:
        """Where the value of ``key`` came from (default, a file, FIBER_KEY, init())."""
        return self._origins.get(key, "default")

    @property
    def options(self) -> dict[str, Option]:
        return dict(self._options)

    def to_env(self) -> dict[str, str]:
        """FIBER_<KEY> variables that reproduce every non-default value in a job
        (except this process's own network identity, see ``PER_PROCESS_KEYS``)."""
        env = {}
        for key, value in self._values.items():
            if value is None or self.origin(key) == "default" or key in PER_PROCESS_KEYS:
                continue
            if isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = str(value)
            env[f"FIBER_{key.upper()}"] = text
        return env

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items()) if v is not None)
        return f"Config({items})"


def closest_key(key: str, options: Iterable[str]) -> str | None:
    """The declared key ``key`` is most likely a misspelling of, if any."""
    import difflib

    found = difflib.get_close_matches(key, list(options), n=1, cutoff=0.75)
    return found[0] if found else None


def unknown_key_message(key: str, options: Mapping[str, Option], where: str = "",
                        owner: tuple[str, bool] | None = None) -> str:
    """One line: the closest key, the other backend that declares it (``owner``, else asked
    of :data:`key_owner`), or the valid keys."""
    from fibercore.plugins import KNOWN_DISTRIBUTIONS, install_hint

    src = f" in {where}" if where else ""
    text = f"unknown fibercore config key {key!r}{src}"
    close = closest_key(key, options)
    if close is not None:
        return f"{text}: did you mean {close!r}?"
    if owner is None:
        owner = key_owner(key)
    if owner is not None:
        name, installed = owner
        dist = KNOWN_DISTRIBUTIONS.get(name, f"fiber-{name}")
        if not installed:
            return f"{text}: `{key}` is a key of the {dist} backend, which is not installed: {install_hint(dist)}."
        return (f"{text}: `{key}` is a key of the {name} backend ({dist}), which is not the selected one: choose "
                f"it (backend = {name} in the file, FIBER_BACKEND={name} or init(backend={name!r})); "
                f"`FIBER_BACKEND={name} fiber config {key}` shows its value")
    prefix = key.partition("_")[0]
    if prefix in BACKEND_KEY_PREFIXES and not any(k.startswith(f"{prefix}_") for k in options):
        return (f"{text}: the {KNOWN_DISTRIBUTIONS[prefix]} backend has no such key (`FIBER_BACKEND={prefix} fiber "
                "config --all` lists its keys)")
    return f"{text}. Valid keys: {', '.join(sorted(options))}."


def unknown_variable_message(name: str, options: Mapping[str, Option]) -> str:
    """The one-line warning for a ``FIBER_*`` variable that names no key (a misspelling?)."""
    close = closest_key(name[len("FIBER_"):].lower(), options)
    if close is not None:
        return f"fibercore: ignoring {name} (no such key): did you mean FIBER_{close.upper()}?"
    return f"fibercore: ignoring {name}: no config key of that name (`fiber config --all` lists them)"


#: The running program's effective configuration, and its plugins' options (None before it
#: has one). Set by :mod:`fibercore.runtime`, which builds both: this module never imports it.
effective: Callable[[], Config] | None = None
plugin_options: Callable[[], list[Option]] = list


def _from_file(conf_file: str | os.PathLike[str] | None) -> Config:
    """The original fiber's ``Config(conf_file)``: defaults < that file < ``FIBER_*``."""
    # the running backend's keys too (kubernetes_namespace...)
    options: list[Option] = list(CORE_OPTIONS) + plugin_options()
    if conf_file is None:
        file_values, file_name = read_file_values()
    else:
        file_values, file_name = read_ini(Path(conf_file)) if Path(conf_file).is_file() else ({}, None)
    return build_config(options, file_values, file_name, read_env_values(os.environ), {})


def check_owner(path: Path) -> None:
    """Refuse a config file another user could have written (``python_exe``, ``image`` or a
    backend's command in it decide what every job runs): it must belong to this user (or
    root) and be writable by no one else (group-writable only for the user's private group)."""
    try:
        st = path.stat()
    except OSError:
        return
    me = os.geteuid()
    fix = f"chown {me} '{path}' && chmod go-w '{path}'"
    if st.st_uid not in (me, 0):
        raise ConfigError(f"{path} belongs to another user (uid {st.st_uid}); a config file decides what "
                          f"every job runs, so fibercore reads only yours. If it is yours to trust: {fix}")
    import stat

    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid)):
        raise ConfigError(f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o}); a config "
                          f"file decides what every job runs. Fix: chmod go-w '{path}'")


def _private_group(gid: int) -> bool:
    """Whether ``gid`` is this user's own group with no other member (Debian's user groups)."""
    try:
        import grp
        import pwd

        me = pwd.getpwuid(os.geteuid())
        group = grp.getgrgid(gid)
    except (ImportError, KeyError):
        return False
    return gid == me.pw_gid and all(member == me.pw_name for member in group.gr_mem)


def read_ini(candidate: Path) -> tuple[dict[str, str], str]:
    """The ``[default]`` section of an INI file (``.fiberconfig``), and its name."""
    check_owner(candidate)
    parser = configparser.ConfigParser()
    try:
        parser.read(candidate)
    except configparser.Error as exc:
        raise ConfigError(f"cannot parse {candidate}: {exc}. It must be INI with a [default] section.") from exc
    others = [name for name in parser.sections() if name != "default"]
    if others:
        raise ConfigError(
            f"{candidate}: unknown section [{others[0]}]; fibercore reads the [default] section "
            f"only (as the original fiber): rename it to [default]")
    section = "default" if parser.has_section("default") else None
    values = dict(parser.items(section)) if section else dict(parser.defaults())
    return values, str(candidate)


def read_file_values(cwd: str | os.PathLike[str] | None = None) -> tuple[dict[str, str], str | None]:
    """Raw values from ``.fiberconfig`` or ``[tool.fiber]`` in pyproject.toml, and the file used."""
    base = Path(cwd or os.getcwd())
    explicit = os.environ.get("FIBER_CONFIG_FILE")
    candidate = Path(explicit) if explicit else base / ".fiberconfig"
    if candidate.is_file():
        return read_ini(candidate)
    pyproject = base / "pyproject.toml"
    if pyproject.is_file():
        try:
            import tomllib
        except ModuleNotFoundError:  # pragma: no cover - python 3.10
            return {}, None
        try:
            data = tomllib.loads(pyproject.read_text())
        except (tomllib.TOMLDecodeError, OSError) as exc:
            raise ConfigError(f"cannot parse {pyproject}: {exc}") from exc
        section = data.get("tool", {}).get("fiber")
        if isinstance(section, dict):
            check_owner(pyproject)
            return dict(section), f"{pyproject} [tool.fiber]"
    return {}, None


def read_env_values(environ: Mapping[str, str]) -> dict[str, str]:
    return {
        name[len("FIBER_") :].lower(): value
        for name, value in environ.items()
        if name.startswith("FIBER_") and name not in ENV_SWITCHES
    }


_warned_variables: set[str] = set()


def _warn_unknown_variable(name: str, options: Mapping[str, Option]) -> None:
    """Once per process, and only in a master: its jobs inherit the same environment."""
    _warn_once(name, unknown_variable_message(name, options))


def _warn_once(name: str, line: str) -> None:
    if name in _warned_variables or os.environ.get("FIBER_MASTER_ADDR"):
        return
    _warned_variables.add(name)
    print(line, file=sys.stderr)


#: Which backend other than the selected one declares a key: (its name, installed here?).
KeyOwner = Callable[[str], "tuple[str, bool] | None"]

#: The project's backends by the first word of their keys (``ssh_hosts``, ``k8s_namespace``).
BACKEND_KEY_PREFIXES = ("local", "docker", "k8s", "aws", "slurm", "ssh")


def known_backend_owner(key: str) -> tuple[str, bool] | None:
    """The project's backend whose keys start like ``key`` (``ssh_hosts``: ssh), as not
    installed: what is assumed when nothing says what is installed."""
    prefix = key.partition("_")[0]
    return (prefix, False) if prefix in BACKEND_KEY_PREFIXES and prefix != key else None


#: The owner of a key the running configuration does not know (set by fibercore.runtime,
#: which can look at the installed backends; this module never imports it).
key_owner: KeyOwner = known_backend_owner


@dataclass(frozen=True)
class OtherBackends:
    """What :func:`build_config` knows of the backends beside the selected one."""

    selected: str = ""
    #: The backend was chosen (init, FIBER_BACKEND, the file), not fallen back to.
    chosen: bool = True
    owner_of: KeyOwner = known_backend_owner


def other_backend_key_message(key: str, where: str, owner: tuple[str, bool], others: OtherBackends) -> str:
    """One line: a key of another backend is ignored, and what would make it count."""
    from fibercore.plugins import KNOWN_DISTRIBUTIONS, install_hint

    name, installed = owner
    dist = KNOWN_DISTRIBUTIONS.get(name, f"fiber-{name}")
    if not installed:
        return (f"fibercore: ignoring {key!r} ({where}): a key of the {dist} backend, which is not installed "
                f"({install_hint(dist)})")
    return (f"fibercore: ignoring {key!r} ({where}): a key of the {name} backend, but no backend was chosen and "
            f"this program runs on {others.selected or 'another'}: set backend = {name} (or FIBER_BACKEND={name}) "
            "to use it")


def build_config(
    options: Iterable[Option],
    file_values: Mapping[str, Any],
    file_name: str | None,
    env_values: Mapping[str, str],
    init_values: Mapping[str, Any],
    backend_defaults: Mapping[str, Any] | None = None,
    others: OtherBackends | None = None,
) -> Config:
    """Merge the sources over the defaults, converting and validating every value. A key of
    another backend in the file or a variable is ignored: one config file serves every
    backend, and ``FIBER_BACKEND=local`` must run a program whose file also says
    ``ssh_hosts``. It is ignored silently when a backend was chosen; otherwise (the program
    may have been meant for that backend), and for a backend that is not installed, with one
    line. ``init()`` is code: a key of another backend there is an error."""
    others = others or OtherBackends()
    table: dict[str, Option] = {}
    for opt in options:
        if opt.name in table and table[opt.name].plugin != opt.plugin:
            raise ConfigError(
                f"config key {opt.name!r} is declared by both {table[opt.name].plugin} and "
                f"{opt.plugin}; uninstall one of them or ask its author to rename the key."
            )
        table[opt.name] = opt
    values = {name: opt.default for name, opt in table.items()}
    origins: dict[str, str] = {}
    legacy: dict[str, Any] = {}

    def apply(source: Mapping[str, Any], origin_of: Any, strict: bool) -> None:
        for key, raw in source.items():
            key = key.strip().lower().replace("-", "_")
            if key in LEGACY_KEYS:
                warnings.warn(
                    f"fibercore: config key {key!r} ({origin_of(key)}) has no effect: "
                    f"{LEGACY_KEYS[key]}.",
                    stacklevel=4,
                )
                try:
                    legacy[key] = LEGACY_OPTIONS[key].convert(raw)
                except (TypeError, ValueError):
                    pass  # it has no effect either way
                continue
            opt = table.get(key)
            if opt is None:
                owner = others.owner_of(key)
                if owner is not None and any(k.startswith(f"{owner[0]}_") for k in table):
                    owner = None  # the selected backend's prefix: a misspelling
                if owner is not None and source is not init_values:
                    if not (owner[1] and others.chosen):
                        _warn_once(f"key:{key}", other_backend_key_message(key, origin_of(key), owner, others))
                    continue
                if strict:
                    raise ConfigError(unknown_key_message(key, table, origin_of(key), owner))
                _warn_unknown_variable(f"FIBER_{key.upper()}", table)
                continue
            try:
                values[key] = opt.convert(raw)
            except (TypeError, ValueError) as exc:
                raise ConfigError(
                    f"bad value for config key {key!r} from {origin_of(key)}: {exc}. "
                    f"Expected {opt.type_name}: {opt.help}"
                ) from None
            origins[key] = origin_of(key)

    for key, value in (backend_defaults or {}).items():
        if key in table:
            values[key] = table[key].convert(value)
    apply(file_values, lambda k: file_name or "config file", strict=True)
    apply(env_values, lambda k: f"environment variable FIBER_{k.upper()}", strict=False)
    apply(init_values, lambda k: f"fibercore.init({k}=...)", strict=True)
    return Config(table, values, origins, legacy=legacy)


# -- uber/fiber compatibility: ``fiber.config.<key>`` and ``fiber.config.get_dict()`` -------------
def _effective() -> Config:
    if effective is None:  # `import fibercore` imports fibercore.runtime, which sets it
        raise RuntimeError("fibercore.config is used before fibercore.runtime was imported: import fibercore")
    return effective()


def get_dict() -> dict[str, Any]:
    """The effective configuration as a plain dict (the original fiber's ``config.get_dict()``)."""
    return dict(_effective())


def __getattr__(name: str) -> Any:
    """``fibercore.config.start_timeout``: a key of the effective configuration, as the
    original fiber kept its values as attributes of ``fiber.config`` (read after ``init()``)."""
    if name.startswith("__"):
        raise AttributeError(name)
    config = _effective()
    if name in config:
        return config[name]
    raise AttributeError(unknown_key_message(name, config.options))
