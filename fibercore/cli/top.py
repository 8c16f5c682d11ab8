"""``fiber top``: a refreshing terminal view of the programs running on this machine.

It finds masters through the status directory (:mod:`fibercore.observe.status`), touches
the watch file of each session it shows (that is what makes a master sample itself), and
draws what the master wrote: the jobs with their state, CPU and memory, and each Pool's
workers and tasks. ``q`` or Ctrl-C quits; ``--once`` prints one frame and exits (for
scripts, and for a program that just started: it waits for the first sample).

Text that came from a job or a status file (names, exception text, the command line) is
shown with its control characters escaped (``\x1b``): a task's exception must not be able
to retitle, clear or write the clipboard of the terminal that watches it.
"""

from __future__ import annotations

import argparse
import curses
import re
import time
from typing import Any

from fibercore.observe import status

#: Seconds a first sample may take to appear (the master looks once a second).
FIRST_SAMPLE = 4.0


#: C0 and C1 controls, DEL, and the format characters that reorder or hide text (bidi, zero width).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def printable(text: Any) -> str:
    """``text`` with every control character shown as an escape (``\x1b``, ``\u202e``)."""
    return _CONTROL.sub(lambda m: ascii(m.group())[1:-1], str(text))


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "-"
    mib = n / (1 << 20)
    return f"{mib / 1024:.1f}G" if mib >= 1024 else f"{mib:.0f}M"


def _num(v: Any) -> str:
    return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))


def _table(rows: list[list[str]], width: int) -> list[str]:
    rows = [[printable(cell) for cell in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()[:width] for r in rows]


def render(found: list[dict[str, Any]], snaps: dict[str, dict[str, Any] | None], width: int = 160) -> list[str]:
    """The lines of one frame: for each session, its master, pools, jobs and queues."""
    lines = [f"fiber top · {len(found)} program{'s' if len(found) != 1 else ''} on this machine · "
             f"{time.strftime('%H:%M:%S')} · q quits"]
    if not found:
        lines.append("")
        lines.append("no fibercore program runs here (a program appears once it starts its first job)")
    for info in found:
        session = info["session"]
        snap = snaps.get(session)
        lines.append("")
        if snap is None:
            lines.append(f"session {session} · {info.get('program', '?')} · pid {info.get('pid')} · "
                         "waiting for its first sample...")
            continue
        m = snap["master"]
        lines.append(f"session {session} · {snap['program']} · backend {snap['backend']} · pid {m['pid']} · "
                     f"up {int(snap['time'] - snap['started'])} s · master CPU {_num(m['cpu_percent'])}% "
                     f"{_bytes(m['rss_bytes'])}"[:width])
        if snap["pools"]:
            rows = [["POOL", "STATE", "BUSY", "IDLE", "START", "DEAD", "QUEUED", "RUNNING", "DONE", "FAILED",
                     "RETRIED", "TASKS/S", "LAST ERROR"]]
            for p in snap["pools"]:
                c, st = p["worker_counts"], p["stats"]
                error = p["broken"] or (p["last_error"] or {}).get("text") or "-"
                rows.append([p["name"], p["state"], str(c["busy"]), str(c["idle"]), str(c["starting"]),
                             str(c["dead"]), str(p["queued"]), str(p["running"]), str(st["done_tasks"]),
                             str(st["failed_tasks"]), str(st["retried_chunks"] + st["rerun_after_error"]),
                             _num(p["tasks_per_s"]), error])
            lines += _table(rows, width)
        if snap["jobs"]:
            rows = [["JOB", "ROLE", "BACKEND", "ID", "HOST", "STATE", "CPU%", "MEM"]]
            for j in snap["jobs"]:
                rows.append([j["name"], j["role"], str(j["backend"]), _num(j["jid"]), _num(j["host"]), j["state"],
                             _num(j["cpu_percent"]), _bytes(j["rss_bytes"])])
            lines += [""] + _table(rows, width)
        if snap["queues"]:
            lines.append("")
            lines.append(("queues: " + ", ".join(f"{q['id']} ({q['depth']} waiting)" for q in snap["queues"]))[:width])
        if snap["managers"] or snap["sync"]:
            lines.append(f"managers: {len(snap['managers'])} · shared objects: {len(snap['sync'])}")
    return [printable(line) for line in lines]


def _look(session: str | None) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any] | None]]:
    found = [s for s in status.sessions() if session is None or s["session"] == session]
    for info in found:
        status.watch(info["session"])
    return found, {info["session"]: status.read_status(info["session"]) for info in found}


def once(session: str | None) -> int:
    """Print one frame, after waiting (a few seconds at most) for every program's first sample."""
    deadline = time.monotonic() + FIRST_SAMPLE
    found, snaps = _look(session)
    while any(v is None for v in snaps.values()) and time.monotonic() < deadline:
        time.sleep(0.2)
        found, snaps = _look(session)
    print("\n".join(render(found, snaps)))
    return 0 if found or session is None else 1


def _draw(screen: Any, session: str | None, interval: float) -> None:
    curses.curs_set(0)
    screen.timeout(int(interval * 1000))
    while True:
        found, snaps = _look(session)
        height, width = screen.getmaxyx()
        screen.erase()
        for y, line in enumerate(render(found, snaps, width - 1)[: height - 1]):
            screen.addnstr(y, 0, line, width - 1, curses.A_BOLD if y == 0 else curses.A_NORMAL)
        screen.refresh()
        key = screen.getch()
        if key in (ord("q"), ord("Q"), 27):
            return


def main(args: argparse.Namespace) -> int:
    if args.session is not None and not any(s["session"] == args.session for s in status.sessions()):
        from fibercore.errors import ConfigError

        raise ConfigError(f"no program of session {args.session} runs on this machine: `fiber top` alone "
                          "lists the ones that do")
    if args.once:
        return once(args.session)
    try:
        curses.wrapper(_draw, args.session, max(0.2, float(args.interval)))
    except KeyboardInterrupt:
        pass
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", nargs="?", metavar="SESSION", help="only this session (default: every program here)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")


__all__ = ["add_arguments", "main", "once", "render"]
