"""One look at a running master: its jobs, pools, queues, managers and shared objects.

A snapshot is plain data (a dict of lists of dicts: JSON as it is), taken by the recorder
about once a second while ``fiber top`` or the dashboard looks. Rates (CPU %, tasks per
second) come from the difference with the previous look, which :class:`Sampler` keeps.
Everything is read through :mod:`fibercore.observe.registry`, never other modules' privates.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

from fibercore.backendkit.helpers import process_usage
from fibercore.observe import registry


class Sampler:
    """Takes snapshots and keeps what the next one needs for its rates."""

    def __init__(self, session: str, backend: str) -> None:
        self.session = session
        self.backend = backend
        self.started = time.time()
        self._cpu: dict[str, tuple[float, float]] = {}  # job key -> (monotonic, cpu seconds)
        self._done: dict[str, tuple[float, int]] = {}  # pool name -> (monotonic, tasks done)

    def _cpu_percent(self, key: str, cpu_seconds: float | None, now: float, seen: dict[str, Any]) -> float | None:
        if cpu_seconds is None:
            return None
        before = self._cpu.get(key)
        seen[key] = (now, cpu_seconds)
        if before is None or now <= before[0]:
            return None
        return round(100.0 * (cpu_seconds - before[1]) / (now - before[0]), 1)

    def take(self) -> dict[str, Any]:
        """The snapshot of now."""
        from fibercore.runtime import get_runtime

        now = time.monotonic()
        seen_cpu: dict[str, Any] = {}
        own = process_usage(os.getpid())
        master = {
            "pid": os.getpid(),
            "cpu_percent": self._cpu_percent("master", own.cpu_seconds if own else None, now, seen_cpu),
            "rss_bytes": own.rss_bytes if own else None,
            "threads": threading.active_count(),
        }
        pools = self._pools(now)
        roles = {w["name"]: f"worker of {p['name']}" for p in pools for w in p["workers"]}
        managers = [m._view() for m in registry.managers()]
        roles.update({m["process"]: f"server of {m['kind']}" for m in managers if m.get("process")})
        plugins = get_runtime().plugins
        jobs = []
        for p in registry.started():
            job, code = p.job, p.returncode
            usage = plugins.job_usage(job) if job is not None and code is None else None
            key = f"job:{getattr(job, 'jid', p.name)}"
            jobs.append({
                "name": p.name,
                "role": roles.get(p.name, "process"),
                "jid": getattr(job, "jid", None),
                "pid": getattr(job, "pid", None),
                "backend": getattr(job, "backend", self.backend),
                "host": getattr(job, "host", None),
                "state": "starting" if job is None else ("running" if code is None else f"exited {code}"),
                "cpu_percent": self._cpu_percent(key, usage.cpu_seconds if usage else None, now, seen_cpu),
                "rss_bytes": usage.rss_bytes if usage else None,
            })
        self._cpu = seen_cpu
        jobs.sort(key=lambda j: (j["role"], j["name"]))
        return {
            "session": self.session,
            "backend": self.backend,
            "program": " ".join(sys.argv) or sys.executable,
            "started": self.started,
            "time": time.time(),
            "master": master,
            "jobs": jobs,
            "pools": pools,
            "queues": registry.listed("queues"),
            "managers": managers,
            "sync": registry.listed("sync"),
        }

    def _pools(self, now: float) -> list[dict[str, Any]]:
        out = []
        seen: dict[str, tuple[float, int]] = {}
        for pool in registry.pools():
            view = pool._view()
            if view is None:
                continue
            done = view["stats"]["done_tasks"] + view["stats"]["failed_tasks"]
            before = self._done.get(view["name"])
            seen[view["name"]] = (now, done)
            view["tasks_per_s"] = (round((done - before[1]) / (now - before[0]), 1)
                                   if before is not None and now > before[0] else None)
            counts = {"busy": 0, "idle": 0, "starting": 0, "retiring": 0, "leaving": 0}
            for w in view["workers"]:
                counts[w["state"]] = counts.get(w["state"], 0) + 1
            counts["dead"] = view["stats"]["replaced_workers"]
            view["worker_counts"] = counts
            if view["last_error"] is not None:
                at, text = view["last_error"]
                view["last_error"] = {"time": at, "text": text}
            out.append(view)
        self._done = seen
        return out


__all__ = ["Sampler"]
