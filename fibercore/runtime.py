"""Per-process state: effective config, plugins, the session and its secret.

Built lazily on first use (or by :func:`init`). In the master, the session id and
its secret are generated here; in a worker they come from the environment the
backend delivered (``FIBER_SESSION``; the secret from an inherited descriptor
``FIBER_SECRET_FD``, a file ``FIBER_SECRET_FILE``, a backend's store, or
``FIBER_SECRET``) and the variables are removed from ``os.environ`` at once, so user subprocesses do not inherit them.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import secrets
import stat
import threading
from typing import Any

from fibercore import config as _config
from fibercore.errors import ConfigError
from fibercore.plugins import Plugins, check_contract, detect_backend, redact
from fibercore.types import Option
from fibercore.util import install_excepthook, truthy_env
from fibercore.wire import Authenticator, Channel, Limits

log = logging.getLogger("fibercore")


class Runtime:
    """Everything a process needs to talk to jobs and to its peers."""

    def __init__(self, config: _config.Config, plugins: Plugins, session: str, secret: bytes,
                 is_worker: bool) -> None:
        self.config = config
        self.plugins = plugins
        plugins.config = config
        self.session = session
        self.secret = secret
        redact(secret)
        self.is_worker = is_worker
        self.transport = plugins.transport(config)
        self.serializer = plugins.serializer(config)
        if self.transport is None:
            name = config.get("transport")
            raise ConfigError(f"no installed transport plugin answers to transport = {name!r}: install it "
                              f"(pip install fiber-{name}) or set transport = tcp (the built-in)")
        if self.serializer is None:  # pragma: no cover - the built-in always answers
            raise ConfigError("no serializer plugin is registered")
        self._listen_host: str | None = None
        self._limits: Limits | None = None

    @property
    def backend(self) -> str:
        return self.plugins.backend

    @property
    def listen_host(self) -> str:
        if self._listen_host is None:
            self._listen_host = self.config.get("listen_host") or self.plugins.listen_host()
        return self._listen_host

    @property
    def bind_host(self) -> str:
        return self.config.get("bind_host") or self.listen_host

    def listen(self, kind: str, key: bytes | None = None, host: str | None = None, port: int = 0,
               service: str | None = None) -> Channel:
        """A new authenticated listening channel on the backend's listen host.

        ``key`` replaces the session secret (a manager with its own ``authkey``);
        ``service`` names what listens (``pool``, ``queue``...), bound into every proof.
        The channel's address is the transport's, then ``#`` and the listener's identity
        (:mod:`fibercore.wire.handshake`): a dialer of that address accepts only this listener.
        """
        auth = Authenticator(key or self.secret, kind, self.limits, service, clear=self.clear_frames)
        fixed = {"port": port} if port else {}  # a fixed port (a manager's address): transports may refuse
        endpoint = self.transport.listen(kind, host or self.bind_host, host or self.listen_host, auth=auth, **fixed)
        return Channel(endpoint, kind, listening=True, address=f"{endpoint.address}#{auth.identity.hex()}")

    def dial(self, kind: str, address: str, key: bytes | None = None, service: str | None = None) -> Channel:
        """A channel connected (and authenticated) to the listening channel at ``address``."""
        target, expect = split_identity(address)
        auth = Authenticator(key or self.secret, kind, self.limits, service, expect, clear=self.clear_frames)
        return Channel(self.transport.dial(kind, target, auth=auth), kind, listening=False, address=address)

    @property
    def listener_kind(self) -> tuple[str, str, bool, bool]:
        """What a long-lived listener (the admin hub, the sync service) must have been made
        with to serve this configuration's jobs: its address, TLS and network encryption."""
        return self.listen_host, self.bind_host, bool(self.config.get("tls")), self.clear_frames

    @property
    def clear_frames(self) -> bool:
        """Whether network frames go authenticated but unencrypted (``network_encryption=False``)."""
        return not self.config.get("network_encryption")

    @property
    def limits(self) -> Limits:
        """What an unauthenticated or authenticated peer may cost an endpoint (config keys)."""
        if self._limits is None:
            self._limits = Limits(
                handshake_timeout=float(self.config.get("handshake_timeout")),
                max_pending=int(self.config.get("max_pending_connections")),
                max_pending_per_peer=int(self.config.get("max_pending_per_peer")),
                max_peers=int(self.config.get("max_connections")),
                max_frame=int(self.config.get("max_frame_size")),
            )
        return self._limits


def split_identity(address: str) -> tuple[str, bytes | None]:
    """A channel address's transport part and the listener identity it names (or None)."""
    target, sep, fragment = address.rpartition("#")
    if not sep:
        return address, None
    try:
        identity = bytes.fromhex(fragment)
    except ValueError:
        identity = b""
    if len(identity) != 16:
        raise ConfigError(f"{address!r} is not an address fibercore gave out (its part after '#' must be "
                          "the 32 hex digits of a listener identity): copy the whole address, or give "
                          "host and port only")
    return target, identity


_runtime: Runtime | None = None
_lock = threading.RLock()
_extra_plugins: list[Any] = []
_adopted: tuple[str, bytes] | None = None  # credentials a multiprocessing parent handed over


def _setup_logging(cfg: _config.Config, process_name: str | None = None) -> None:
    """fibercore's logger at the configured level, to stderr or to ``log_file``.

    ``log_file=dir/name.log`` writes one file per process, ``name.log.MainProcess``,
    ``name.log.Process-3``... (the original fiber's layout: a job never writes into its
    master's file), creating ``dir``. In a job the file is opened once its process has its
    name (``process_name``, from the worker's start-up). ``log_file=stdout``: standard output.
    """
    import sys

    logger = logging.getLogger("fibercore")
    level = "debug" if cfg.get("debug") else cfg.get("log_level", "warning")
    logger.setLevel(level.upper())
    path = cfg.get("log_file")
    if process_name is None and os.environ.get("FIBER_MASTER_ADDR") and path and path != "stdout":
        return  # a job before its name is known: see fibercore.worker
    target = path if not path or path == "stdout" else f"{path}.{process_name or _main_process_name()}"
    for old in [h for h in logger.handlers if getattr(h, "_fiber", None) is not None]:
        if old._fiber == target:  # type: ignore[attr-defined]
            return
        logger.removeHandler(old)
        old.close()
    if not target:
        return
    if target == "stdout":
        handler: logging.Handler = logging.StreamHandler(sys.stdout)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        stream = _open_log(target)
        if stream is None:
            return
        handler = logging.StreamHandler(stream)
    handler._fiber = target  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(levelname)s:%(processName)s(%(process)d):%(threadName)s %(name)s: %(message)s"))
    logger.addHandler(handler)


def _open_log(target: str) -> Any:
    """The log file ``target`` opened for appending, or None (one WARNING line on stderr) when
    it is a link, not a regular file, or another user's (a name in a directory others can
    write, ``/tmp``, may have been made by someone else first), or when another user could
    change its directory (:func:`fibercore.util.others_can_change`). Made with mode 0600."""
    import sys

    from fibercore.util import others_can_change

    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    why = others_can_change(os.path.dirname(os.path.abspath(target)))
    if why is None:
        try:
            fd = os.open(target, flags, 0o600)
        except OSError as exc:
            why = os.strerror(exc.errno or 0) if exc.errno != errno.ELOOP else "it is a symbolic link"
        else:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                why = "it is not a regular file"
            elif st.st_uid != os.geteuid():
                why = f"it belongs to uid {st.st_uid}"
            else:
                os.set_blocking(fd, True)
                return os.fdopen(fd, "a", buffering=1, encoding="utf-8")
            os.close(fd)
    sys.stderr.write(f"fibercore: WARNING: not logging to {target}: {why}; set log_file to a path in a "
                     "directory only you can write\n")
    return None


def _main_process_name() -> str:
    from fibercore.process import current_process

    return current_process().name


def setup_job_logging(process_name: str) -> None:
    """In a job, once its process has its name: the per-process log file (if one is set)."""
    _setup_logging(get_runtime().config, process_name)


def _secret_lines(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _read_secret_fd(fd: int) -> dict[str, str]:
    """``KEY=value`` lines from an inherited descriptor (the local backend's), which is then closed."""
    chunks = []
    try:
        while chunk := os.read(fd, 4096):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return _secret_lines(b"".join(chunks).decode())


def _take_inherited_secret() -> dict[str, str]:
    """Read and close an inherited ``FIBER_SECRET_FD`` now, at ``import fibercore``: a
    subprocess the program starts before its first fibercore call (``os.system``) must
    inherit neither the descriptor nor the variable."""
    fd = os.environ.pop("FIBER_SECRET_FD", None)
    if not fd:
        return {}
    try:
        return _read_secret_fd(int(fd))
    except (ValueError, OSError):
        return {}


_inherited_secret = _take_inherited_secret()


def adopt_inherited_secret(lines: str) -> None:
    """``KEY=value`` lines handed over other than by descriptor (a job forked by the local
    backend's template, which imported fibercore before the job existed)."""
    _inherited_secret.clear()
    _inherited_secret.update(_secret_lines(lines))


def _session_from_env(plugins: Plugins, cfg: _config.Config) -> tuple[str, bytes] | None:
    session = os.environ.get("FIBER_SESSION")
    if not session:
        return None
    secret_hex = os.environ.pop("FIBER_SECRET", None)
    inherited = _inherited_secret.get("FIBER_SECRET")
    if secret_hex is None and inherited:
        secret_hex = inherited
    secret_file = os.environ.pop("FIBER_SECRET_FILE", None)
    if secret_hex is None and secret_file:
        with open(secret_file) as fh:
            secret_hex = fh.read().strip()
    if secret_hex is None:
        secret_hex = plugins.job_secret(session, cfg)  # a backend's own store (fiber_job_secret)
    if not secret_hex:
        raise ConfigError(
            "FIBER_SESSION is set but neither FIBER_SECRET nor FIBER_SECRET_FILE is, and no "
            "plugin's fiber_job_secret returned it: this worker cannot authenticate. The "
            "backend must deliver the session secret."
        )
    return session, bytes.fromhex(secret_hex)


def build(init_values: dict[str, Any] | None = None) -> Runtime:
    install_excepthook()  # before anything here can raise a ConfigError
    init_values = dict(init_values or {})
    file_values, file_name = _config.read_file_values()
    env_values = _config.read_env_values(os.environ)
    chosen = (
        init_values.get("backend")
        or os.environ.get("FIBER_BACKEND")
        or file_values.get("backend")
        or (None if truthy_env("FIBER_DISABLE_PLUGIN_AUTOLOAD") else detect_backend())
    )
    backend = (
        chosen
        or init_values.get("default_backend")
        or env_values.get("default_backend")
        or file_values.get("default_backend")
        or "local"
    )
    plugins = Plugins.load(str(backend).strip(), _extra_plugins)
    options = list(_config.CORE_OPTIONS) + plugins.config_options()
    cfg = _config.build_config(options, file_values, file_name, env_values, init_values,
                               backend_defaults=plugins.config_defaults(),
                               others=_config.OtherBackends(plugins.backend, bool(chosen),
                                                            lambda key: other_backend_owner(key, plugins.backend)))
    cfg.select_backend(plugins.backend)
    _setup_logging(cfg)
    # A multiprocessing child of a job inherits the job's FIBER_SESSION but not its secret
    # (read once, from a pipe or a file): what its parent handed over comes first.
    found = None if _adopted is not None else _session_from_env(plugins, cfg)
    if found is not None:
        session, secret = found
        is_worker = bool(os.environ.get("FIBER_MASTER_ADDR"))
    elif _adopted is not None:
        (session, secret), is_worker = _adopted, False
    else:
        session, secret, is_worker = secrets.token_hex(6), secrets.token_bytes(32), False
        log.info("fibercore session %s (its jobs carry the label fiber-session=%s; "
                 "`fiber cleanup --session %s` stops them)", session, session, session)
        # Children started through this process's own subprocesses share the session.
    return Runtime(cfg, plugins, session, secret, is_worker)


def credentials_for_child() -> tuple[str, bytes] | None:
    """The session's id and secret while ``multiprocessing`` pickles a child's start data.

    multiprocessing hands its ``authkey`` to a spawn or forkserver child inside the
    private start-up pipe; fibercore objects (queues, pipe ends, proxies) pickled for
    such a child carry the session's credentials the same way, and only then: the
    secret never travels in any other pickle, nor in the environment.
    """
    from multiprocessing import context

    if context.get_spawning_popen() is None:
        return None
    rt = get_runtime()
    return rt.session, rt.secret


def adopt_credentials(credentials: tuple[str, bytes] | None) -> None:
    """In a child started by ``multiprocessing``: use the parent's session (see above)."""
    global _adopted
    if credentials is None:
        return
    with _lock:
        _adopted = credentials
        rt = _runtime
        if rt is not None and not os.environ.get("FIBER_SESSION"):
            rt.session, rt.secret = credentials


def get_runtime() -> Runtime:
    global _runtime
    rt = _runtime
    if rt is None:
        with _lock:
            if _runtime is None:
                _runtime = build()
            rt = _runtime
    return rt


@functools.cache
def other_backend_owner(key: str, selected: str) -> tuple[str, bool] | None:
    """The installed backend other than ``selected`` that declares ``key`` (name, True); a
    project backend that is not installed whose keys start like it (name, False); else None.
    Asked only for a key the running configuration does not know (rare: imports plugins)."""
    from fibercore.plugins import BACKENDS_GROUP, installed

    infos = installed(BACKENDS_GROUP)
    mine = {info.value.strip() for info in infos if info.name == selected}
    for info in infos:
        if info.value.strip() not in mine and key in _declared_keys(info.value.strip()):
            return info.name, True
    owner = _config.known_backend_owner(key)
    if owner is not None and owner[0] in {info.name for info in infos}:
        return None  # installed, and that backend has no such key: a misspelling
    return owner


@functools.cache
def _declared_keys(value: str) -> frozenset[str]:
    """The config keys the backend plugin at entry point ``value`` declares (none if it fails)."""
    from fibercore.plugins import load_value

    try:
        plugin = load_value(value)
        return frozenset(opt.name for opt in plugin.fiber_config_options() or ())
    except Exception:  # a broken plugin declares nothing; loading it as the backend says why
        return frozenset()


def _plugin_options() -> list[Option]:
    """The running backend's and plugins' config options (none before the program has a runtime)."""
    return _runtime.plugins.config_options() if _runtime is not None else []


# config.py reads the effective configuration through these; it never imports this module.
_config.effective = lambda: get_runtime().config
_config.plugin_options = _plugin_options
_config.key_owner = lambda key: other_backend_owner(key, _runtime.backend if _runtime is not None else "")


def init(**kwargs: Any) -> _config.Config:
    """(Re)initialise fibercore with config values that override every other source.

    Unknown keys raise :class:`~fibercore.errors.ConfigError` listing the valid ones.
    Keeps the session (and its secret) of an existing runtime, so objects already
    created stay usable.
    """
    global _runtime
    with _lock:
        new = build(kwargs)
        if _runtime is not None:
            new.session, new.secret, new.is_worker = _runtime.session, _runtime.secret, _runtime.is_worker
        _runtime = new
    if new.config.get("dashboard") and not new.is_worker:
        from fibercore import dashboard

        dashboard.if_asked()
    return new.config


def register_plugin(plugin: Any) -> None:
    """Register a plugin object programmatically (takes effect now and on later init())."""
    check_contract(plugin, getattr(plugin, "__name__", repr(plugin)))
    _extra_plugins.append(plugin)
    if _runtime is not None and not _runtime.plugins.pm.is_registered(plugin):
        _runtime.plugins.pm.register(plugin)


def unregister_plugin(plugin: Any) -> None:
    if plugin in _extra_plugins:
        _extra_plugins.remove(plugin)
    if _runtime is not None and _runtime.plugins.pm.is_registered(plugin):
        _runtime.plugins.pm.unregister(plugin)
