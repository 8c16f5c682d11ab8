"""Hook contract 3: every backend in this repository (and the third-party fixture) uses
fibercore's public names only, so a backend written outside it needs nothing more.

Public for plugin packages: ``fibercore`` (its ``__all__``: ``hookimpl``, the errors...),
:mod:`fibercore.types`, :mod:`fibercore.backendkit`, :mod:`fibercore.errors`. Their tests
may also use the test kit, :mod:`fibercore.testing` and :mod:`fibercore.testing.targets`.
The check reads each file's AST: imports, and attributes of ``fibercore`` taken through an
``import fibercore [as fc]`` name.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import fibercore

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_MODULES = {"fibercore.types", "fibercore.backendkit", "fibercore.errors", "fibercore.transport"}
TEST_MODULES = PACKAGE_MODULES | {"fibercore.testing", "fibercore.testing.targets"}
PUBLIC_NAMES = set(fibercore.__all__)


def _plugin_files() -> list[tuple[Path, bool]]:
    """(file, is a test file) for every plugin package and its tests."""
    roots = [*sorted((ROOT / "plugins").glob("fiber_*")), ROOT / "tests" / "fixtures" / "fiber_echo"]
    out = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).parts
            if {"build", "cluster"} & set(parts) or any(p.endswith(".egg-info") for p in parts):
                continue
            out.append((path, parts[0] == "tests"))
    return out


def private_uses(source: str, is_test: bool) -> list[str]:
    """Every use of a fibercore name that is not public, as 'line N: what'."""
    allowed = TEST_MODULES if is_test else PACKAGE_MODULES
    found: list[str] = []
    aliases: set[str] = set()  # names bound to the fibercore package itself
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "fibercore":
                    aliases.add(alias.asname or "fibercore")
                elif alias.name.startswith("fibercore.") and alias.name not in allowed:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "fibercore":
                for alias in node.names:
                    if alias.name not in PUBLIC_NAMES and f"fibercore.{alias.name}" not in allowed:
                        found.append(f"line {node.lineno}: from fibercore import {alias.name}")
            elif node.module.startswith("fibercore.") and node.module not in allowed:
                found.append(f"line {node.lineno}: from {node.module} import ...")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases and node.attr not in PUBLIC_NAMES
                and f"fibercore.{node.attr}" not in allowed):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


FILES = _plugin_files()


@pytest.mark.parametrize("path,is_test", FILES, ids=[str(p.relative_to(ROOT)) for p, _ in FILES])
def test_plugins_use_public_names_only(path: Path, is_test: bool) -> None:
    bad = private_uses(path.read_text(), is_test)
    assert not bad, (
        f"{path.relative_to(ROOT)} uses fibercore internals: {'; '.join(bad)}. A backend may use "
        "fibercore.types, fibercore.backendkit, fibercore.errors and fibercore's __all__ (its tests "
        "also fibercore.testing); what it needs from the core comes as hook arguments (config, spec.session)."
    )


def test_every_backend_is_checked() -> None:
    checked = {p.relative_to(ROOT).parts[:2] for p, _ in FILES}
    for name in ("fiber_local", "fiber_docker", "fiber_k8s", "fiber_aws", "fiber_slurm", "fiber_ssh", "fiber_nng"):
        assert ("plugins", name) in checked


@pytest.mark.parametrize("source,is_test", [
    ("from fibercore.runtime import get_runtime", False),
    ("import fibercore.pool.scheduler", False),
    ("import fibercore as fc\nfc.runtime.get_runtime()", False),
    ("from fibercore import runtime", False),
    ("from fibercore.testing import BackendConformance", False),
])
def test_the_check_finds_private_uses(source: str, is_test: bool) -> None:
    assert private_uses(source, is_test)


@pytest.mark.parametrize("source,is_test", [
    ("from fibercore.types import Job\nfrom fibercore.backendkit import parse_pairs", False),
    ("import fibercore\n@fibercore.hookimpl\ndef fiber_listen_host(): pass", False),
    ("import fibercore as fc\nfc.Process", True),
    ("from fibercore.testing import BackendConformance", True),
])
def test_the_check_accepts_public_uses(source: str, is_test: bool) -> None:
    assert private_uses(source, is_test) == []
