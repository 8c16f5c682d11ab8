"""Small helpers for backend configuration, exit codes and local process readings (no API objects, no heavy imports)."""

from __future__ import annotations

import os
import socket

from fibercore.types import JobUsage

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


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


def process_usage(pid: int) -> JobUsage | None:
    """CPU time and resident memory of process ``pid`` on this machine (Linux ``/proc``),
    for ``fiber_job_usage``; None when it is gone or there is no ``/proc``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if len(fields) < 22 or fields[0] == b"Z":
        return None
    # After the name: state is field 3 of proc(5); utime 14, stime 15, rss (pages) 24.
    return JobUsage(cpu_seconds=(int(fields[11]) + int(fields[12])) / _TICKS, rss_bytes=int(fields[21]) * _PAGE)
