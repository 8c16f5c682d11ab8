"""A backend package built from a fixture folder, installed in a fresh virtualenv, selected
with FIBER_BACKEND (and by detection), runs a Process: no change to the core."""

from __future__ import annotations

import os
import re
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
def venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    # See the test environment's packages (fibercore, cryptography...) without downloading them.
    pth = next((root / "lib").glob("python*/site-packages")) / "parent.pth"
    dirs = [d for d in site.getsitepackages() if os.path.isdir(d)]
    # addsitedir also processes .pth files there (editable installs of fibercore use one).
    pth.write_text("import site; " + "; ".join(f"site.addsitedir({d!r})" for d in dirs) + "\n")
    subprocess.run(
        [str(root / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", str(FIXTURE)],
        check=True,
    )
    return root


def run(venv: Path, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FIBER_")}
    return subprocess.run([str(venv / "bin" / "python"), str(script)], capture_output=True, text=True,
                          env={**clean, **env}, timeout=120, cwd=tmp_path)


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
    out = run(venv, tmp_path, FIBER_BACKEND="slurm")
    assert out.returncode != 0
    listed = re.search(r"installed backends: ([^)]*)\)", out.stderr)
    assert listed is not None, out.stderr
    assert {"echo", "local"} <= set(listed.group(1).split(", "))  # and any other installed here
    assert "pip install fiber-slurm" in out.stderr
