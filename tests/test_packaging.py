"""The built distribution holds every package of the source tree (an editable install hides a
missing one; the docker image, built from wheels, does not)."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_every_fibercore_package_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "fibercore").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert on_disk <= listed, f"packages missing from pyproject.toml: {sorted(on_disk - listed)}"
