"""``python -m fibercore.cli.boot [script | -m module | -c code] [args]``: how ``fiber run``
starts a Python master.

fibercore is imported first: it reads and closes the descriptor that carries the session
secret (``FIBER_SECRET_FD``). Then the program runs as ``python`` would have run it
(``__main__``, ``sys.argv``, ``sys.path[0]``), so no descriptor carrying the secret exists
when the program's own code runs: an ``os.system()`` before its ``import fibercore`` passes
nothing on.
"""

from __future__ import annotations

import os
import runpy
import sys
import types

import fibercore  # noqa: F401  # takes the inherited secret (fibercore.runtime)

#: Interpreter options that take a value as the next argument (``-X dev``, ``-W error``).
_WITH_VALUE = frozenset({"-X", "-W", "-Q"})


def interpreter_options(args: list[str]) -> tuple[list[str], list[str]]:
    """Split ``python``'s own options (``-u``, ``-X dev``...) off the front of ``args``: they
    go before ``-m fibercore.cli.boot``; the rest (a script, ``-m``, ``-c``) after it."""
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-", "-m", "-c") \
            and not args[i].startswith(("-m", "-c")):
        i += 2 if args[i] in _WITH_VALUE else 1
    return args[:i], args[i:]


def main(argv: list[str]) -> None:
    if not argv or argv[0] == "-":
        raise SystemExit("fibercore.cli.boot: give a script, -m module or -c code")
    if argv[0].startswith("-m"):
        module, rest = (argv[0][2:], argv[1:]) if len(argv[0]) > 2 else (argv[1], argv[2:])
        sys.argv = [module, *rest]
        sys.path[0] = os.getcwd()
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    elif argv[0].startswith("-c"):
        code, rest = (argv[0][2:], argv[1:]) if len(argv[0]) > 2 else (argv[1], argv[2:])
        sys.argv = ["-c", *rest]
        sys.path[0] = ""
        main_module = types.ModuleType("__main__")
        sys.modules["__main__"] = main_module
        exec(compile(code, "<string>", "exec"), main_module.__dict__)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
