"""``fiber backends``, ``fiber config`` and ``fiber doctor``: what is installed, configured and working."""

from __future__ import annotations

import argparse
from typing import Any

from fibercore.plugins import PLUGINS_GROUP, backends_by_module, declared_contract, installed


def backends(args: argparse.Namespace) -> int:
    from fibercore import __version__
    from fibercore.hookspecs import CONTRACT_VERSION, MIN_CONTRACT_VERSION
    from fibercore.runtime import get_runtime

    print(f"fibercore {__version__}, hook contract {CONTRACT_VERSION} "
          f"(loads plugins declaring {MIN_CONTRACT_VERSION}..{CONTRACT_VERSION})")
    rows: list[tuple[str, ...]] = [("backend", "aliases", "distribution", "contract", "module")]
    for info, aliases in backends_by_module():
        rows.append((info.name, ", ".join(aliases) or "-", f"{info.distribution} {info.version}",
                     _declared(info.value), info.value))
    _table("Installed backends (entry points fiber.backends):", rows)
    extensions = installed(PLUGINS_GROUP)
    if extensions:
        rows = [("extension", "distribution", "contract", "module")]
        rows += [(i.name, f"{i.distribution} {i.version}", _declared(i.value), i.value) for i in extensions]
        _table("\nExtensions (entry points fiber.plugins):", rows)
    rt = get_runtime()
    print(f"\nSelected backend: {rt.backend}; registered plugins, their contract and hooks:")
    for name, hooks in rt.plugins.describe():
        version = rt.plugins.contract_of(name)
        print(f"  {name} (contract {version if version is not None else 'undeclared'}): {', '.join(hooks)}")
    return 0


def _table(title: str, rows: list[tuple[str, ...]]) -> None:
    print(title)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def _declared(value: str) -> str:
    """The contract an entry point's plugin declares, importing it (plugins import light)."""
    from fibercore.plugins import load_value

    try:
        plugin = load_value(value)
    except Exception as exc:  # a broken plugin is listed, not fatal
        return f"? (import failed: {type(exc).__name__})"
    version = declared_contract(plugin)
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
    print(_wire_line(rt))
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


def _wire_line(rt: Any) -> str:
    """Which transport and serializer plugins this configuration resolves to."""
    transport = getattr(rt.transport, "name", type(rt.transport).__name__)
    tls = " (TLS)" if rt.config.get("tls") else ""
    serializer = getattr(rt.serializer, "name", type(rt.serializer).__name__)
    return f"transport: {transport}{tls} ({type(rt.transport).__module__}); serializer: {serializer}"


def _doctor_order(asked: list[str] | None) -> list[tuple[str, str]]:
    """(backend, heading) to check: the asked ones, else the selected backend first, then every
    other installed backend once (an alias is the same backend)."""
    from fibercore.errors import BackendNotFoundError
    from fibercore.plugins import installed_backends, unknown_backend_message
    from fibercore.runtime import get_runtime

    if asked:
        known = installed_backends()
        for name in asked:
            if name not in known:
                raise BackendNotFoundError(unknown_backend_message(name))
        return [(name, name) for name in dict.fromkeys(asked)]
    selected = get_runtime().backend
    order: list[tuple[str, str]] = []
    for info, aliases in backends_by_module():
        names = [info.name, *aliases]
        label = info.name + (f" ({', '.join(aliases)})" if aliases else "")
        if selected in names:
            order.insert(0, (selected, f"{label}: the selected backend"))
        else:
            order.append((info.name, label))
    return order


def doctor(args: argparse.Namespace) -> int:
    """Check the selected backend, then every other installed one; exit 1 when the selected
    (or an asked-for) backend has a problem."""
    from fibercore.errors import FiberError
    from fibercore.runtime import build, get_runtime

    print(_wire_line(get_runtime()))
    order = _doctor_order(args.backend)
    failed = 0
    failed_selected = 0
    for index, (name, heading) in enumerate(order):
        print(f"{heading}:")
        before = failed
        try:
            checks = build({"backend": name}).plugins.doctor()
        except (FiberError, Exception) as exc:  # a backend that cannot even load is a "no"
            print(f"  no   loads: {type(exc).__name__}: {exc}")
            failed += 1
            checks = []
        if not checks:
            print("  ?    this backend's plugin has no checks (fiber_doctor)")
        for check in checks:
            mark = "ok " if check.ok else "no "
            text = check.detail or ""
            if not check.ok and check.fix and check.fix in text:  # said once, on the fix line
                text = text.replace(check.fix, "").strip(" ;,.")
            detail = f": {text}" if text else ""
            print(f"  {mark}  {check.what}{detail}")
            if not check.ok:
                failed += 1
                if check.fix:
                    print(f"       fix: {check.fix}")
        if index == 0 or args.backend:
            failed_selected += failed - before
    if not failed:
        print("\nno problems found")
    elif failed_selected:
        print(f"\n{failed} problem(s) found, {failed_selected} of them in {order[0][0]!r}"
              if not args.backend else f"\n{failed} problem(s) found")
    else:
        print(f"\n{failed} problem(s) found, none in the selected backend {order[0][0]!r} "
              f"(the others matter only if you select them)")
    return 1 if failed_selected else 0
