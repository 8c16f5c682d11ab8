"""Small helpers for backend configuration and exit codes (no API objects, no heavy imports)."""

from __future__ import annotations

import socket


def parse_pairs(text: str | None, key: str, error: type[Exception] = ValueError,
                example: str = "team=rl,exp=42") -> dict[str, str]:
    """``"a=1, b = 2"`` -> ``{"a": "1", "b": "2"}``; a malformed entry raises ``error``
    naming the config ``key`` and the expected form."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise error(f"{key} entry {item!r} is not KEY=VALUE; example: {key}={example}")
        out[name.strip()] = value.strip()
    return out


def signal_exit_code(status: int) -> int:
    """128+N (a process killed by signal N) becomes -N; other statuses stay as they are."""
    if 128 < status < 128 + 65:
        return -(status - 128)
    return status


def outward_address() -> str:
    """The address of the interface that routes outward (selecting a route sends no
    packet), or 127.0.0.1 when there is no route."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only selects a route
        return str(probe.getsockname()[0])
    except OSError:
        return "127.0.0.1"
    finally:
        probe.close()
