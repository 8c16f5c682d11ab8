"""What the tests on the multi-host cluster share: the liveness bound they set, waiting for a
state (never a fixed sleep), and looking at a host from outside (its /proc, not the network)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest

#: The liveness bound of the cluster tests (seconds) and the heartbeat behind it.
BOUND, BEAT = 4.0, 0.5
#: What a declaration may take beyond the bound: a heartbeat, the pool's poll, ssh's probe.
MARGIN = 15.0


def wait_for(condition: Any, timeout: float, what: str) -> float:
    """Seconds until ``condition()`` held; fails the test after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"{what} (after {timeout:.0f} s)")
        time.sleep(0.05)
    return time.monotonic() - start


def worker_pids(cluster: Any, host: Any) -> list[int]:
    """The fibercore workers running on ``host`` (read from its /proc, not over the network)."""
    out = cluster.exec(host, ["/opt/fiber/bin/python", "-c",
                              "import os\n"
                              "for p in filter(str.isdigit, os.listdir('/proc')):\n"
                              "    try: c = open(f'/proc/{p}/cmdline','rb').read()\n"
                              "    except OSError: continue\n"
                              "    if b'-m\\0fibercore.worker\\0' in c: print(p)"])
    return [int(p) for p in out.split()]


def hosts_of(pool: Any) -> Counter[str]:
    """How many of the pool's workers run on each host (by address)."""
    return Counter(p.job.data.host.name for p in pool.workers() if p.job is not None and p.job.data.host)


def host_of(cluster: Any, process: Any) -> Any:
    """The cluster host a Process runs on."""
    return next(h for h in cluster.hosts if h.address == process.job.data.host.name)
