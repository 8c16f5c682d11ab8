"""``fiber backends``, ``fiber config`` and ``fiber doctor``: what is installed, configured and working."""

from __future__ import annotations

import argparse
import importlib

from fibercore.plugins import BACKENDS_GROUP, PLUGINS_GROUP, declared_contract, installed


def backends(args: argparse.Namespace) -> int:
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
    try:
        module = importlib.import_module(value.split(":")[0].strip())
    except Exception as exc:  # a broken plugin is listed, not fatal
        return f"? (import failed: {type(exc).__name__})"
    version = declared_contract(module)
    return str(version) if version is not None else "undeclared"


def config(args: argparse.Namespace) -> int:
    """Every key with its value and origin (default, file, FIBER_KEY, init()), by plugin."""
    from fibercore.config import unknown_key_message
    from fibercore.errors import ConfigError
    from fibercore.runtime import get_runtime

    rt = get_runtime()
    cfg = rt.config
    options = cfg.options
    for key in args.keys:
        if key not in options:
            raise ConfigError(unknown_key_message(key, options))
    keys = args.keys or sorted(options, key=lambda k: (options[k].plugin != "fibercore", options[k].plugin, k))
    print(f"backend: {rt.backend}")
    shown = 0
    for key in keys:
        origin = cfg.origin(key)
        if origin == "default" and not (args.all or args.keys):
            continue
        print(f"{key} = {cfg.get(key)!r}  ({origin}; {options[key].plugin})")
        shown += 1
    if not shown:
        print("(every key is at its default; `fiber config --all` lists them)")
    return 0


def doctor(args: argparse.Namespace) -> int:
    """Run every installed backend's checks; exit 1 when any of them says no."""
    from fibercore.errors import FiberError
    from fibercore.runtime import build

    names = args.backend or [info.name for info in installed(BACKENDS_GROUP)]
    failed = 0
    for name in names:
        print(f"{name}:")
        try:
            checks = build({"backend": name}).plugins.doctor()
        except (FiberError, Exception) as exc:  # a backend that cannot even load is a "no"
            print(f"  no   loads: {type(exc).__name__}: {exc}")
            failed += 1
            continue
        if not checks:
            print("  ?    this backend's plugin has no checks (fiber_doctor)")
        for check in checks:
            mark = "ok " if check.ok else "no "
            detail = f": {check.detail}" if check.detail else ""
            print(f"  {mark}  {check.what}{detail}")
            if not check.ok:
                failed += 1
                if check.fix:
                    print(f"       fix: {check.fix}")
    print(f"\n{failed} problem(s) found" if failed else "\nno problems found")
    return 1 if failed else 0
