"""The master's recorder: one thread that looks once a second, and samples only when someone looks.

Started when the master starts its first job. Each second it does one ``stat`` of the
session's watch file (:mod:`fibercore.observe.status`); only while ``fiber top`` keeps that
fresh, or while the dashboard is on, does it take a snapshot (:class:`Sampler`), keep a
point of the history the dashboard plots, and (for ``fiber top``) write the status file.
A program nobody looks at pays one ``stat`` a second. It also answers ``fiber logs`` from
another terminal (a request file and the bell): the output the backend keeps of its jobs.

When the status directory cannot be used (:class:`fibercore.observe.status.StatusDirError`)
the program says so in one line and runs unseen by ``fiber top``; the recorder still samples
for the dashboard. This module never imports the dashboard: the dashboard uses it.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

from fibercore.observe import status
from fibercore.observe.snapshot import Sampler

log = logging.getLogger("fibercore.observe")

#: Seconds between looks; points of history kept (an hour at one a second).
INTERVAL = 1.0
HISTORY = 3600
#: Characters of output one ``fiber logs`` answer carries at most, shared out among the jobs.
LOGS_MAX = 4 << 20


def point(snap: dict[str, Any]) -> dict[str, Any]:
    """The numbers of one snapshot the dashboard plots over time."""
    pools = snap["pools"]
    counts: dict[str, int] = {}
    for p in pools:
        for state, n in p["worker_counts"].items():
            counts[state] = counts.get(state, 0) + n
    return {
        "t": snap["time"],
        "tasks_per_s": sum(p["tasks_per_s"] or 0.0 for p in pools),
        "busy": counts.get("busy", 0),
        "idle": counts.get("idle", 0),
        "starting": counts.get("starting", 0),
        "queued": sum(p["queued"] for p in pools),
        "queue_depth": sum(q["depth"] for q in snap["queues"]),
        "master_cpu": snap["master"]["cpu_percent"],
        "master_rss": snap["master"]["rss_bytes"],
    }


class Recorder:
    """Samples once a second while ``fiber top`` watches or the dashboard is on; otherwise
    sleeps on its bell (:func:`fibercore.observe.status.wait_for_bell`)."""

    def __init__(self, session: str, backend: str) -> None:
        self.session = session
        self.sampler = Sampler(session, backend)
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        self.latest: dict[str, Any] | None = None
        self.always = False  # the dashboard is on: sample even when no fiber top looks
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._folder: Path | None = None
        self._bell: Path | None = None
        self._logs_answered = 0.0  # the time of the last fiber logs request answered
        try:
            self._folder = status.status_dir()
            status.announce(session, {"pid": self.pid, "program": " ".join(sys.argv) or sys.executable,
                                      "backend": backend, "started": time.time()}, self._folder)
            self._bell = status.make_bell(session, self._folder)
        except OSError as exc:  # the program runs, unseen by fiber top
            self._folder = None
            _say_unseen(exc)
        atexit.register(self.close)
        self._thread = threading.Thread(target=self._run, name="fiber-observe", daemon=True)
        self._thread.start()

    def sample(self) -> dict[str, Any]:
        """Take a snapshot now, keep it and its point of history."""
        with self._lock:
            snap = self.sampler.take()
            self.latest = snap
            self.history.append(point(snap))
        return snap

    def wake(self) -> None:
        """Look now (the dashboard was turned on, or the program ends)."""
        if self._bell is not None:
            status.ring(self._bell)

    def _answer_logs(self) -> None:
        """Answer the ``fiber logs`` requests made since the last answer (one answer for all)."""
        if self._folder is None:
            return
        try:
            asked = status.logs_wanted(self.session, self._folder, self._logs_answered)
            if asked is not None:
                self._logs_answered = asked
                status.write_logs(self.session, asked, recent_output(), self._folder)
        except Exception:  # a view must never take the program (or this thread) down
            log.debug("observe: answering fiber logs failed", exc_info=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._answer_logs()
            watched = self._folder is not None and status.watched(self.session, self._folder)
            if not (watched or self.always):
                if self._bell is not None:
                    status.wait_for_bell(self._bell)  # no wake-up at all while nobody looks
                elif self._stop.wait(INTERVAL):
                    return
                continue
            try:
                snap = self.sample()
                if watched and self._folder is not None:
                    status.write_status(self.session, snap, self._folder)
            except Exception:  # a view must never take the program down
                log.debug("observe: a sample failed", exc_info=True)
            if self._stop.wait(INTERVAL):
                return

    def close(self) -> None:
        self._stop.set()
        if os.getpid() == self.pid:
            self.wake()
            if self._folder is not None:
                status.withdraw(self.session, self._folder)


def recent_output(limit: int = LOGS_MAX) -> list[dict[str, Any]]:
    """What the backend keeps of the output of this master's jobs, each job's end, at most
    ``limit`` characters in all."""
    from fibercore.observe import registry
    from fibercore.runtime import get_runtime

    jobs = [p for p in registry.started() if p.job is not None]
    share = max(1, limit // max(1, len(jobs)))
    plugins = get_runtime().plugins
    return [{"jid": str(p.job.jid), "name": p.name, "text": plugins.job_logs(p.job)[-share:]} for p in jobs]


_recorder: Recorder | None = None
_unseen = False  # the status directory could not be used: said once
_lock = threading.Lock()


def _say_unseen(exc: OSError) -> None:
    global _unseen
    if not _unseen:
        _unseen = True
        print(f"fibercore: WARNING: fiber top will not see this program: {exc}", file=sys.stderr, flush=True)


def master_started() -> Recorder | None:
    """The master started a job: from now on ``fiber top`` can find it (idempotent; cheap
    after the first call). None in a worker, or in a child forked from a master."""
    found = _recorder
    if found is not None and found.pid == os.getpid():
        return found
    return current()


def current() -> Recorder | None:
    """This master's recorder, made on first use (None in a worker or a forked child)."""
    global _recorder
    from fibercore.runtime import get_runtime

    if get_runtime().is_worker:
        return None
    if _recorder is not None and _recorder.pid != os.getpid():
        return None  # a child forked from a master: the master is the program fiber top shows
    with _lock:
        if _recorder is None or _recorder.pid != os.getpid():
            _recorder = Recorder(get_runtime().session, str(get_runtime().backend))
        return _recorder


__all__ = ["HISTORY", "INTERVAL", "LOGS_MAX", "Recorder", "current", "master_started", "point", "recent_output"]
