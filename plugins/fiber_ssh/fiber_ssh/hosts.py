"""The machines jobs may run on: ``ssh_hosts`` (``host:slots,...``, as Open MPI's ``-H``) and
``ssh_hostfile`` (one host per line: ``[user@]host [slots=N] [port=P] [python=PATH]``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

from fibercore.errors import ConfigError

_NAME = re.compile(r"^(?:[A-Za-z0-9._-]+@)?[A-Za-z0-9.:_%\[\]-]+$")


@dataclass
class Host:
    """One machine: how to reach it, how many jobs it takes, and its state."""

    name: str  # [user@]host as given
    slots: int | None = None  # None: the host's CPU count, asked on first use
    port: int | None = None
    python: str | None = None
    used: int = 0
    down_until: float = 0.0  # after a lost connection it is skipped until then
    down_reason: str = ""
    jobs: set[str] = field(default_factory=set)

    @property
    def address(self) -> str:
        """The host part, without the user."""
        return self.name.rsplit("@", 1)[-1]

    @property
    def user(self) -> str | None:
        return self.name.rsplit("@", 1)[0] if "@" in self.name else None


def _check_name(name: str, where: str) -> str:
    if not _NAME.match(name) or name.startswith("-"):
        raise ConfigError(f"{where}: {name!r} is not a host name ([user@]host); fix ssh_hosts / ssh_hostfile")
    return name


def _positive(value: str, key: str, where: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{where}: {key}={value!r} must be a positive integer")
    return int(value)


def parse_hosts(text: str) -> list[Host]:
    """``a:4,user@b:8,c`` -> hosts (a host without ``:slots`` gets its CPU count)."""
    hosts = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, slots = item.rpartition(":") if re.search(r":\d+$", item) else (item, "", "")
        _check_name(name, "ssh_hosts")
        hosts.append(Host(name, slots=_positive(slots, "slots", f"ssh_hosts {item!r}") if slots else None))
    return hosts


def parse_hostfile(path: str) -> list[Host]:
    """An Open MPI-style hostfile, plus ``port=`` and ``python=`` per host."""
    full = os.path.expanduser(path)
    try:
        with open(full) as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"ssh_hostfile {path!r} cannot be read: {exc.strerror}") from None
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        host = Host(_check_name(words[0], where))
        for word in words[1:]:
            key, eq, value = word.partition("=")
            if not eq:
                raise ConfigError(f"{where}: {word!r} is not key=value (slots=, port=, python=)")
            if key in ("slots", "max_slots"):
                host.slots = _positive(value, key, where)
            elif key == "port":
                host.port = _positive(value, key, where)
            elif key == "python":
                host.python = value
            else:
                raise ConfigError(f"{where}: unknown key {key!r} (known: slots, port, python)")
        hosts.append(host)
    return hosts


def hosts_from_config(hosts_text: str | None, hostfile: str | None) -> list[Host]:
    """Every configured host, in order; a clear error when there is none."""
    hosts = (parse_hosts(hosts_text) if hosts_text else []) + (parse_hostfile(hostfile) if hostfile else [])
    if not hosts:
        raise ConfigError("the ssh backend has no hosts: set ssh_hosts (FIBER_SSH_HOSTS=host1:4,host2:8) "
                          "or ssh_hostfile (one '[user@]host slots=N' per line)")
    seen: set[tuple[str, int | None]] = set()
    for host in hosts:
        if (host.name, host.port) in seen:
            raise ConfigError(f"host {host.name!r} is listed twice in ssh_hosts / ssh_hostfile")
        seen.add((host.name, host.port))
    return hosts
