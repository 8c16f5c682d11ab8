"""The ``fiber`` command: run a program on a cluster and look after its jobs.

    fiber run [--backend B] [--image I | --build [DIR]] [--push REGISTRY] -- python app.py
    fiber ps | top [SESSION] | logs JOB|SESSION | stop SESSION | cp SRC DST | config | doctor | backends | cleanup

Each command lives in its own module (``run``, ``jobs``, ``top``, ``info``); this one builds the
parser and turns a :class:`~fibercore.errors.FiberError` into a one-line message and
exit code 2. :data:`COMMANDS` is the list the documentation must cover.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

#: Every subcommand, as documented in docs/cli.md (a meta-test checks both ways).
COMMANDS = ("run", "ps", "top", "logs", "stop", "cp", "config", "doctor", "backends", "cleanup")


def _add_backend(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", help="backend to use (default: the selected one: FIBER_BACKEND, config, detection)")


def build_parser() -> argparse.ArgumentParser:
    from fibercore import __version__
    from fibercore.cli import info, jobs, run, top

    parser = argparse.ArgumentParser(prog="fiber", description="fibercore command line")
    parser.add_argument("--version", action="version",
                        version=f"fibercore {__version__} (Python {sys.version.split()[0]})")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, func: Callable[[argparse.Namespace], int], text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=text, description=text)
        p.set_defaults(func=func)
        return p

    run.add_arguments(add("run", run.main, "run a program's master as a job on the backend and stream its output"))
    _add_backend(p := add("ps", jobs.ps, "list the jobs of each fiber session on the backend"))
    p.add_argument("--session", help="only this session's jobs")
    top.add_arguments(add("top", top.main, "watch the programs running on this machine: jobs, CPU, memory, "
                                           "each Pool's workers and tasks (q quits)"))
    _add_backend(p := add("logs", jobs.logs, "print the output of a job, or of every job of a session"))
    p.add_argument("target", metavar="JOB|SESSION", help="a job id or a session id (from fiber ps)")
    _add_backend(p := add("stop", jobs.stop, "stop every job of a session, its master first"))
    p.add_argument("session", metavar="SESSION")
    _add_backend(p := add("cp", jobs.cp, "copy files to or from a job's working directory (JOB:PATH)"))
    p.add_argument("source", metavar="SRC", help="JOB:PATH or a local path")
    p.add_argument("destination", metavar="DST", help="JOB:PATH or a local path")
    _add_backend(p := add("config", info.config, "print the effective configuration and where each value came from"))
    p.add_argument("keys", nargs="*", metavar="KEY", help="only these keys")
    p.add_argument("--all", action="store_true", help="also the keys left at their default")
    p = add("doctor", info.doctor, "check the selected backend, then each other installed one: reachable? "
                                   "credentials? image? (with fixes)")
    p.add_argument("--backend", action="append", help="check only this backend (repeatable)")
    add("backends", info.backends, "list installed backends and plugins, their contract and hooks")
    _add_backend(p := add("cleanup", jobs.cleanup, "remove jobs a crashed master left behind"))
    p.add_argument("--session", help="stop every job of this session, even if its master runs "
                                     "(default: the jobs of every session whose master is gone)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from fibercore.errors import FiberError
    from fibercore.util import debug_enabled

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FiberError as exc:  # a configuration or backend problem: the message says the fix
        print(f"fiber {args.command}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a backend's or Docker's error: its message, not a traceback
        if debug_enabled():
            raise
        print(f"fiber {args.command}: {type(exc).__name__}: {exc}\n(FIBER_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
