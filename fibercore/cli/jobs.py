"""``fiber ps``, ``logs``, ``stop``, ``cp`` and ``cleanup``: the jobs of sessions, from any process.

Jobs are found by the ``fiber-session`` label every backend attaches (hooks
``fiber_list_jobs``, ``fiber_read_job_logs``, ``fiber_copy_files``), so these commands
work from another terminal than the master's, or after it is gone.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from typing import Any

from fibercore.errors import ConfigError
from fibercore.util import printable


def _runtime(args: argparse.Namespace) -> Any:
    from fibercore.runtime import get_runtime, init

    if getattr(args, "backend", None):
        init(backend=args.backend)
    return get_runtime()


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return datetime.datetime.fromtimestamp(epoch).strftime("%Y-%m-%d %H:%M:%S")


def ps(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    found = rt.plugins.list_jobs(args.session)
    if not found:
        print(f"no fiber jobs on backend {rt.backend}" + (f" in session {args.session}" if args.session else ""))
        return 0
    rows: list[tuple[str, ...]] = [("SESSION", "JOB", "NAME", "STATUS", "CREATED", "IMAGE")]
    for info in sorted(found, key=lambda i: (i.session, i.created or 0, i.jid)):
        status = info.status.value + (f" ({info.exitcode})" if info.exitcode is not None else "")
        cells = (info.session, info.jid, info.name, status, _when(info.created), info.image or "-")
        rows.append(tuple(printable(cell) for cell in cells))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


#: Seconds ``fiber logs`` waits for a running master to answer with its jobs' output.
MASTER_ANSWER_WAIT = 5.0


def logs(args: argparse.Namespace) -> int:
    """A job's output, or every job's of a session, as its backend keeps it; where the backend
    keeps none apart from the master (local jobs print to the master's terminal), the running
    master's recent copy, asked through the status directory. Nothing found: one line, exit 2."""
    rt = _runtime(args)
    listed = rt.plugins.list_jobs(None)
    of_session = [i for i in listed if i.session == args.target]
    jobs = of_session or [i for i in listed if i.jid == args.target]
    if not jobs:  # a job the listing does not show (one that ended), or the backend's "no job"
        try:
            found = rt.plugins.read_job_logs(args.target)
        except ConfigError:
            if rt.backend != "local":
                raise
            raise ConfigError(f"no local job or session {args.target!r} runs (`fiber ps` lists what runs): a local "
                              "job's output goes to the terminal of the master that started it, and `fiber logs` "
                              "shows it only while that master runs") from None
        sys.stdout.write(_ending_newline(found))
        return 0
    masters = _masters_here()
    answers: dict[str, dict[str, str]] = {}  # session -> jid -> its master's copy of the output
    blocks, shown, reasons = [], 0, []
    for info in sorted(jobs, key=lambda i: (i.created or 0, i.jid)):
        text: str | None
        try:
            text = rt.plugins.read_job_logs(info.jid)
        except ConfigError as exc:  # kept by the master only (local), or gone
            if info.session not in answers:
                answers[info.session] = _ask_master(info.session, masters)
            text = answers[info.session].get(info.jid)
            if text is None:
                reasons.append(str(exc))
        except Exception as exc:  # one job's logs gone does not hide the others'
            text = None
            reasons.append(f"{type(exc).__name__}: {exc}")
        if text is not None:
            shown += 1
        header = f"==> {printable(info.name)} ({info.jid}, {info.status.value}) <==\n" if of_session else ""
        blocks.append(header + (_ending_newline(text) if text is not None else f"(no logs: {reasons[-1]})\n"))
    if not shown:  # one line, on stderr, exit 2
        raise ConfigError(reasons[0])
    sys.stdout.write("".join(blocks))
    return 0


def _masters_here() -> dict[str, int]:
    """Sessions whose master runs on this machine for this user (they answer ``fiber logs``),
    with the master's pid."""
    from fibercore.observe import status

    try:
        return {info["session"]: info["pid"] for info in status.sessions()}
    except OSError:
        return {}


def _ask_master(session: str, masters: dict[str, int]) -> dict[str, str]:
    """The running master's copy of its jobs' recent output, by job (empty: no answer)."""
    if session not in masters:
        return {}
    from fibercore.observe import status

    answer = status.read_logs(session, status.want_logs(session), masters[session], MASTER_ANSWER_WAIT)
    return {str(job.get("jid")): str(job.get("text", "")) for job in answer or ()}


def _ending_newline(text: str) -> str:
    return text if not text or text.endswith("\n") else text + "\n"


def stop(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    count = rt.plugins.cleanup_jobs(args.session)
    if not count:
        print(f"fiber stop: no running job of session {args.session} on backend {rt.backend} "
              "(fiber ps lists the sessions)", file=sys.stderr)
        return 1
    print(f"stopped {count} job(s) of session {args.session} on backend {rt.backend}")
    return 0


def split_job_path(text: str) -> tuple[str | None, str]:
    """``JOB:PATH`` -> (JOB, PATH); a local path (no colon before the first slash) -> (None, path)."""
    head, sep, tail = text.partition(":")
    if sep and head and "/" not in head and head not in (".", ".."):
        return head, tail or "."
    return None, text


def cp(args: argparse.Namespace) -> int:
    src_job, src = split_job_path(args.source)
    dst_job, dst = split_job_path(args.destination)
    if (src_job is None) == (dst_job is None):
        raise ConfigError(
            "fiber cp copies between a job and this machine: exactly one of SRC and DST must be "
            "JOB:PATH (for example `fiber cp 3f2a9c:results.csv .` or `fiber cp config.yaml 3f2a9c:`)"
        )
    rt = _runtime(args)
    if dst_job is not None:
        rt.plugins.copy_files(dst_job, src, dst, into_job=True)
    else:
        assert src_job is not None
        rt.plugins.copy_files(src_job, src, dst, into_job=False)
    print(f"copied {args.source} -> {args.destination}")
    return 0


def cleanup(args: argparse.Namespace) -> int:
    rt = _runtime(args)
    count = rt.plugins.cleanup_jobs(args.session)
    which = "session " + args.session if args.session else "sessions whose master is gone"
    print(f"removed {count} job(s) of {which} on backend {rt.backend}")
    from fibercore.sharing import sweep

    left = sweep()
    if left:
        print(f"removed {len(left)} shared object(s) of processes that are gone from /dev/shm")
    return 0
