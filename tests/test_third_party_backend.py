"""A backend package built from a fixture folder against hook contract 2, installed in a
fresh virtualenv, selected with FIBER_BACKEND (and by detection), runs a Process and the
conformance suite's lifecycle tests: no change to the core."""

from __future__ import annotations

import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "fixtures" / "fiber_echo"

PROGRAM = textwrap.dedent("""
    import fibercore as mp

    def work(q):
        q.put(("ran", mp.get_runtime().backend))

    if __name__ == "__main__":
        q = mp.Queue()
        p = mp.Process(target=work, args=(q,))
        p.start()
        print(q.get(timeout=60))
        p.join(60)
        print("exitcode", p.exitcode, "backend", mp.get_runtime().backend)
        print(p.logs())
""")


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy of the fixture package (building it in place would leave build/ in the checkout)."""
    copy = tmp_path_factory.mktemp("src") / "fiber_echo"
    shutil.copytree(FIXTURE, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    return copy


@pytest.fixture(scope="module")
def venv(tmp_path_factory, package) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    # See the test environment's packages (fibercore, cryptography...) without downloading them.
    pth = next((root / "lib").glob("python*/site-packages")) / "parent.pth"
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    # addsitedir also processes .pth files there (editable installs of fibercore use one).
    pth.write_text("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
    subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", str(package)],
        check=True,
    )
    return root


def _clean_env(**env: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("FIBER_")}, **env}


def run(venv: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    return subprocess.run([str(venv / "bin" / "python"), str(script)], capture_output=True, text=True,
                          env=_clean_env(**env), timeout=120, cwd=tmp_path)


def test_selected_with_fiber_backend(venv, tmp_path):
    out = run(venv, tmp_path, FIBER_BACKEND="echo")
    assert out.returncode == 0, out.stderr
    assert "('ran', 'echo')" in out.stdout
    assert "exitcode 0 backend echo" in out.stdout
    assert "echo-worker-start backend=echo" in out.stdout  # fiber_worker_start ran, logs work
    assert "echo-job-secret session=" in out.stdout  # the secret came through fiber_job_secret


def test_selected_by_fiber_detect_backend(venv, tmp_path):
    out = run(venv, tmp_path, ECHO_BACKEND_DETECT="1")
    assert out.returncode == 0, out.stderr
    assert "exitcode 0 backend echo" in out.stdout


def test_unknown_backend_lists_the_installed_third_party_one(venv, tmp_path):
    out = run(venv, tmp_path, FIBER_BACKEND="yarn")
    assert out.returncode != 0
    listed = re.search(r"installed: ([^)]*)\)", out.stderr)
    assert listed is not None, out.stderr
    assert {"echo", "local"} <= set(listed.group(1).split(", "))  # and any other installed here
    assert "fiber-yarn" not in out.stderr  # no distribution of that name exists to install


def test_the_conformance_lifecycle_tests_pass_on_it(venv, package, tmp_path):
    """The package's own tests subclass fibercore.testing.BackendConformance; its lifecycle
    tests (exit codes, join, terminate, kill, logs) pass in the fresh venv."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "fiber_lifecycle",
         str(package / "tests")],
        capture_output=True, text=True, env=_clean_env(), timeout=300, cwd=tmp_path,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    passed = re.search(r"(\d+) passed", out.stdout)
    assert passed is not None and int(passed.group(1)) >= 7, out.stdout[-2000:]
