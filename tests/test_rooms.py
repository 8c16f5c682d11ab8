"""The middle layer's rooms form a DAG and keep to their own state (read from the AST).

* The pool's rooms import each other only downwards: shared <- dispatch <- fleet <-
  supervision <- scheduler <- api; so do the pipe's: inbox <- home <- memory, network <-
  readiness <- ``fibercore/connection.py`` (type-only imports included: holding a room
  above is the cycle this forbids).
* No room changes a collection that another object owns: ``other.attr.pop(...)``,
  ``other.attr[k] = v`` or ``del other.attr[k]`` are found wherever ``other`` is not
  ``self``. A room asks the owner's method instead (``fleet.remove(w)``, ``dispatch.forget(w)``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

FIBERCORE = Path(__file__).resolve().parents[1] / "fibercore"
POOL = FIBERCORE / "pool"
#: Each package's rooms, lowest first: a room may import only rooms before it. Plain data and
#: codes (``records``, ``protocol``; the pipes' ops in ``__init__``) are below every room.
ORDER = ["shared", "dispatch", "fleet", "supervision", "scheduler", "api"]
DATA = {"records", "protocol", "worker", "progress", "results"}
PIPES = ["inbox", "home", "memory", "line", "network", "readiness", "connection"]
#: The built-in transport's rooms (``fibercore/builtins/tcp/``), lowest first.
TCP = ["spinning", "options", "addresses", "local", "tls", "connection", "reactor", "admission", "listener",
       "dialer"]
MUTATORS = {"pop", "popleft", "popitem", "clear", "append", "appendleft", "extend", "extendleft",
            "insert", "remove", "discard", "add", "update", "setdefault"}
#: Records whose fields the rooms share by design (their owner is named in records.py):
#: a worker slot's pending table belongs to dispatch, which is the only room that changes it.
SHARED_RECORDS = {"w", "chunk", "slot"}


def package_imports(path: Path, package: str, data: set[str]) -> set[str]:
    """The modules of ``package`` (and ``fibercore.connection``) the file imports, at run
    time or for type checking, leaving out plain data."""
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(f"{package}."):
            found.add(node.module.rsplit(".", 1)[1])
        elif isinstance(node, ast.ImportFrom) and node.module == package:
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module == "fibercore.connection":
            found.add("connection")
    return found - data


def pool_imports(module: str) -> set[str]:
    return package_imports(POOL / f"{module}.py", "fibercore.pool", DATA)


@pytest.mark.parametrize("room", ORDER)
def test_a_pool_room_imports_only_rooms_below_it(room: str) -> None:
    below = set(ORDER[: ORDER.index(room)])
    above = pool_imports(room) - below
    assert not above, f"fibercore/pool/{room}.py imports {sorted(above)}, which are not below it in {ORDER}"


@pytest.mark.parametrize("room", PIPES)
def test_a_pipe_room_imports_only_rooms_below_it(room: str) -> None:
    path = FIBERCORE / ("connection.py" if room == "connection" else f"pipes/{room}.py")
    found = package_imports(path, "fibercore.pipes", {"BYTES", "CLOSE", "OBJ"})
    above = found - set(PIPES[: PIPES.index(room)])
    assert not above, f"{path.relative_to(FIBERCORE.parent)} imports {sorted(above)}, not below it in {PIPES}"


@pytest.mark.parametrize("room", TCP)
def test_a_transport_room_imports_only_rooms_below_it(room: str) -> None:
    path = FIBERCORE / "builtins" / "tcp" / f"{room}.py"
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:  # from .x import ... / from . import x
            found.update([node.module] if node.module else [alias.name for alias in node.names])
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fibercore.builtins.tcp."):
            found.add(node.module.rsplit(".", 1)[1])
    above = found - set(TCP[: TCP.index(room)])
    assert not above, f"{path.relative_to(FIBERCORE.parent)} imports {sorted(above)}, not below it in {TCP}"


def foreign_mutations(source: str) -> list[str]:
    """Each change of another object's collection, as 'line N: code'."""
    found = []

    def owner_of(node: ast.expr) -> ast.expr | None:
        """For ``x.attr`` (the collection), the ``x`` when it is not ``self``."""
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ({"self"} | SHARED_RECORDS):
                return None
            return base
        return None

    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                and owner_of(node.func.value) is not None):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
        targets: list[ast.expr] = []
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = list(node.targets) if isinstance(node, ast.Assign) else [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            if isinstance(target, ast.Subscript) and owner_of(target.value) is not None:
                found.append(f"line {node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return found


@pytest.mark.parametrize("room", [f"pool/{r}" for r in ORDER] + [f"pipes/{r}" for r in PIPES[:-1]] + ["connection"]
                         + [f"builtins/tcp/{r}" for r in TCP])
def test_no_room_changes_another_rooms_collections(room: str) -> None:
    found = foreign_mutations((FIBERCORE / f"{room}.py").read_text())
    # shared.stats is the one collection every room counts into, under the pool's lock.
    found = [f for f in found if "stats[" not in f]
    assert not found, f"fibercore/{room}.py changes collections it does not own:\n" + "\n".join(found)


def test_the_checker_sees_what_it_forbids() -> None:
    bad = "def f(pool, fleet):\n    fleet.workers.pop(1)\n    pool.dispatch.queue.clear()\n    fleet.by_peer[1] = 2\n"
    assert len(foreign_mutations(bad)) == 3
    good = "def f(self, w):\n    self.queue.clear()\n    w.pending.pop(1)\n    self.fleet.remove(w)\n"
    assert foreign_mutations(good) == []
