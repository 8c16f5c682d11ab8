"""The built-in transport's addresses: ``scheme://host:port[/machine]``."""

from __future__ import annotations

from fibercore.errors import TransportError


def split_address(address: str) -> tuple[str, str, int, str]:
    """``scheme://host:port[/machine]``: scheme, host, port and the machine tag (or "")."""
    scheme, _, rest = address.partition("://")
    where, _, machine = rest.partition("/")
    host, _, port = where.rpartition(":")
    if scheme not in ("tcp", "tls+tcp") or not host or not port.isdigit():
        raise TransportError(f"not a tcp:// or tls+tcp:// address: {address!r}")
    return scheme, host.strip("[]"), int(port), machine


def format_address(scheme: str, host: str, port: int, machine: str = "") -> str:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{scheme}://{where}/{machine}" if machine else f"{scheme}://{where}"
