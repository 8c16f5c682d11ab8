"""One meaning for ``fiber_cleanup_jobs`` on every backend.

The core labels every job with :data:`MASTER_LABEL` (which process started it);
:func:`sessions_to_clean` turns a backend's listing into the sessions whose master is gone,
and :func:`clean_session` removes a session's jobs, its master first.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping

#: The label the core puts on every job (``JobSpec.labels``): ``<machine>.<pid>.<start>`` of
#: the process that started it (:func:`master_label`); a value Kubernetes accepts as a label.
MASTER_LABEL = "fiber-master"
#: ``fiber-process``: the process's name; ``master`` for the master ``fiber run`` started as a job.
PROCESS_LABEL = "fiber-process"


def master_label() -> str:
    """This process as :data:`MASTER_LABEL` names it: machine (boot and network namespace),
    pid and start time (a pid alone may be reused)."""
    from fibercore.util import machine_identity, process_start

    return f"{machine_identity() or 'unknown'}.{os.getpid()}.{process_start(os.getpid()) or 0}"


def master_alive(labels: Mapping[str, str]) -> bool | None:
    """Whether the master that started a job (by the job's labels) still runs: True or False
    when it ran on this machine, None when that cannot be told here (another machine, or a job
    without the label)."""
    from fibercore.util import machine_identity, process_start

    machine, _, rest = (labels.get(MASTER_LABEL) or "").partition(".")
    pid, _, start = rest.partition(".")
    if not machine or not pid.isdigit() or machine != machine_identity():
        return None
    return process_start(int(pid)) == start


def sessions_to_clean(jobs: Iterable[tuple[str, Mapping[str, str], bool]]) -> set[str]:
    """What ``fiber_cleanup_jobs(None)`` removes, from each job's (session, labels, still
    running): the sessions whose master is gone.

    1. A session with a master job ``fiber run`` started (``fiber-process=master``): gone when
       no such job runs.
    2. Otherwise, a session whose master ran on this machine: gone when that process ended.
    3. Otherwise (its master is elsewhere, or its jobs carry no label): gone when none of its
       jobs runs any more; one that runs is left to its master (``fiber cleanup SESSION``
       removes it on purpose).
    """
    by_session: dict[str, list[tuple[Mapping[str, str], bool]]] = {}
    for session, labels, running in jobs:
        by_session.setdefault(session, []).append((labels, running))
    gone = set()
    for session, members in by_session.items():
        if not session:
            continue
        masters = [running for labels, running in members if labels.get(PROCESS_LABEL) == "master"]
        if masters:
            if not any(masters):
                gone.add(session)
            continue
        verdicts = {master_alive(labels) for labels, _ in members}
        if verdicts & {True, False}:
            if True not in verdicts:
                gone.add(session)
        elif not any(running for _, running in members):
            gone.add(session)
    return gone


def clean_session(find: Callable[[], Iterable[tuple[str, bool]]], remove: Callable[[list[str]], object],
                  passes: int = 5, pause: float = 0.2) -> int:
    """Remove the jobs of one session, its master first; returns how many were removed.

    ``find()`` gives (job id, is the session's master) for each job of the session that is
    still there; ``remove(ids)`` stops or deletes those jobs. A master (one ``fiber run``
    started) goes first, so that it cannot start replacements for the workers removed after
    it; when there was one, later passes (``passes``, ``pause`` seconds apart and growing)
    catch a job it created while the first listing ran.
    """
    found = list(find())
    masters = [jid for jid, is_master in found if is_master]
    removed: set[str] = set()
    if masters:
        remove(masters)
        removed.update(masters)
        found = list(find())
    for attempt in range(passes):
        rest = [jid for jid, _ in found if jid not in removed]
        if not rest:
            break
        remove(rest)
        removed.update(rest)
        if not masters:
            break
        time.sleep(pause * (attempt + 1))
        found = list(find())
    return len(removed)
