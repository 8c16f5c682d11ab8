"""The ``fiber`` command: ``fiber backends`` lists plugins, ``fiber cleanup`` removes leftovers."""

from __future__ import annotations

import argparse
import sys

from fibercore.plugins import BACKENDS_GROUP, PLUGINS_GROUP, installed


def _backends(args: argparse.Namespace) -> int:
    from fibercore import __version__
    from fibercore.hookspecs import CONTRACT_VERSION, MIN_CONTRACT_VERSION
    from fibercore.runtime import get_runtime

    print(f"fibercore {__version__}, hook contract {CONTRACT_VERSION} "
          f"(loads plugins declaring {MIN_CONTRACT_VERSION}..{CONTRACT_VERSION})")
    print("Installed backends (fiber.backends) and extensions (fiber.plugins):")
    for info in installed(BACKENDS_GROUP) + installed(PLUGINS_GROUP):
        print(f"  {info.group:15} {info.name:12} {info.distribution} {info.version}  "
              f"contract {_declared(info.value)}  ({info.value})")
    rt = get_runtime()
    print(f"\nSelected backend: {rt.backend}; registered plugins, their contract and hooks:")
    for name, hooks in rt.plugins.describe():
        version = rt.plugins.contract_of(name)
        print(f"  {name} (contract {version if version is not None else 'undeclared'}): {', '.join(hooks)}")
    return 0


def _declared(value: str) -> str:
    """The contract an entry point's module declares, importing it (plugins import light)."""
    import importlib

    from fibercore.plugins import declared_contract

    try:
        module = importlib.import_module(value.split(":")[0].strip())
    except Exception as exc:  # a broken plugin is listed, not fatal
        return f"? (import failed: {type(exc).__name__})"
    version = declared_contract(module)
    return str(version) if version is not None else "undeclared"


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
