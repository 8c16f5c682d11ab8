"""The ``fiber`` command: ``fiber backends`` lists plugins, ``fiber cleanup`` removes leftovers."""

from __future__ import annotations

import argparse
import sys

from fibercore.plugins import BACKENDS_GROUP, PLUGINS_GROUP, installed


def _backends(args: argparse.Namespace) -> int:
    from fibercore.runtime import get_runtime

    print("Installed backends (fiber.backends) and extensions (fiber.plugins):")
    for info in installed(BACKENDS_GROUP) + installed(PLUGINS_GROUP):
        print(f"  {info.group:15} {info.name:12} {info.distribution} {info.version}  ({info.value})")
    rt = get_runtime()
    print(f"\nSelected backend: {rt.backend}; registered plugins and their hooks:")
    for name, hooks in rt.plugins.describe():
        print(f"  {name}: {', '.join(hooks)}")
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    from fibercore.runtime import init

    cfg = init(backend=args.backend) if args.backend else init()
    from fibercore.runtime import get_runtime

    count = get_runtime().plugins.cleanup_jobs(args.session)
    print(f"removed {count} job(s) of {'session ' + args.session if args.session else 'sessions whose master is gone'} "
          f"on backend {cfg.get('backend') or get_runtime().backend}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from fibercore import __version__
    from fibercore.errors import FiberError

    parser = argparse.ArgumentParser(prog="fiber", description="fibercore command line")
    parser.add_argument("--version", action="version",
                        version=f"fibercore {__version__} (Python {sys.version.split()[0]})")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("backends", help="list installed backends and plugins").set_defaults(func=_backends)
    clean = sub.add_parser("cleanup", help="remove jobs a crashed master left behind")
    clean.add_argument("--session", help="stop every job of this session, even if its master runs "
                                          "(default: the jobs of every session whose master is gone)")
    clean.add_argument("--backend", help="backend to clean (default: the selected one)")
    clean.set_defaults(func=_cleanup)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except FiberError as exc:  # a configuration or backend problem: the message says the fix
        print(f"fiber {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
