"""``python -m fiber_docker.image`` builds the worker image from what the user has: the wheels
``scripts/wheels`` makes, installed in a fresh venv, with nothing else (the issue's newcomer)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from docker_helpers import CHECKOUT
from fiber_docker.image import installed_constraints, repack


def test_a_repacked_installed_distribution_installs_the_same_files(tmp_path: Path) -> None:
    """A wheel made from an installed distribution's files (what ``fiber_docker.image`` does for
    fibercore installed from wheels): pip installs it, with the same files, bytes for bytes,
    and a RECORD whose hashes pip accepts."""
    dist = metadata.distribution("pluggy")
    wheel = repack(dist, tmp_path)
    assert wheel.name.startswith(f"pluggy-{dist.version}-") and wheel.suffix == ".whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    assert not any(n.endswith((".pyc", "/INSTALLER", "/direct_url.json")) for n in names), names
    target = tmp_path / "target"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                           str(target), str(wheel)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    installed = [f for f in dist.files or ()
                 if f.parts[0] != ".." and f.suffix == ".py" and "__pycache__" not in f.parts]
    assert installed
    for f in installed:
        assert (target / f).read_bytes() == Path(str(f.locate())).read_bytes(), f


def test_the_image_pins_the_versions_this_python_runs() -> None:
    """The default constraints: every distribution installed here at its version, but pip and
    fibercore's own (they go in as wheels)."""
    pins = installed_constraints().splitlines()
    assert f"pluggy=={metadata.version('pluggy')}" in pins
    assert f"cloudpickle=={metadata.version('cloudpickle')}" in pins
    assert not [p for p in pins if p.lower().startswith(("fibercore==", "fiber-docker==", "fiber_docker==", "pip=="))]
    assert not [p for p in pins if "+" in p], "a local version label (torch's +cpu) is on no index"
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return
    assert f"torch=={torch.split('+')[0]}" in pins


def test_a_repacked_wheel_is_the_same_bytes_each_time_and_names_every_tag(tmp_path: Path) -> None:
    """The same installed files make the same wheel (``--content-tag`` reuses the image), and a
    distribution of several tags gets them all in its file name (pip refuses a wheel named by
    one tag of two)."""
    from fiber_docker.image import _compressed

    dist = metadata.distribution("pluggy")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = repack(dist, tmp_path / "a").read_bytes()
    time.sleep(2.1)  # a zip entry's time has 2 s steps: a later run, not the same second
    assert repack(dist, tmp_path / "b").read_bytes() == first
    assert _compressed(["py2-none-any", "py3-none-any"]) == "py2.py3-none-any"
    assert _compressed(["py3-none-any"]) == "py3-none-any"


def test_the_checkout_is_used_when_this_python_imports_it_in_place() -> None:
    """Inside the checkout, with this test venv's editable install (a developer's set-up), the
    image takes the checkout; from another directory too (the editable install points there)."""
    probe = "from fiber_docker.image import checkout_in_use; print(checkout_in_use())"
    for cwd in (CHECKOUT, Path("/")):
        done = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == str(CHECKOUT), (cwd, done.stdout)


def test_a_newcomer_from_scripts_wheels_to_a_pool_on_containers(docker_client: Any, tmp_path: Path) -> None:
    """The docs' docker walk-through, run as written: ``scripts/wheels``, a fresh venv with
    ``pip install fibercore fiber-docker --find-links dist/``, ``python -m fiber_docker.image
    --base <a local Python image>`` (fibercore from that venv's installed wheels: no checkout,
    no index for fibercore), then a Pool whose workers run in containers of that image."""
    base = subprocess.run([str(CHECKOUT / "plugins" / "fiber_docker" / "tests" / "image" / "base.sh")],
                          capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FIBER_")}, "PYTHON": sys.executable}
    done = subprocess.run([str(CHECKOUT / "scripts" / "wheels")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    dist = CHECKOUT / "dist"  # where scripts/wheels puts them, as the README says
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    done = subprocess.run([python, "-m", "pip", "install", "-q", "fibercore", "fiber-docker", "--find-links", str(dist),
                           "-c", str(CHECKOUT / "constraints.txt")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    tag = f"fibercore-test/newcomer:{uuid.uuid4().hex[:12]}"
    try:
        # Run inside the checkout, as the newcomer who cloned it did: `python -m` puts the checkout
        # first on sys.path, but their programs use the installed wheels, and so does the image.
        built = subprocess.run([python, "-m", "fiber_docker.image", "--tag", tag, "--base", base],
                               cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=900)
        assert built.returncode == 0, built.stderr[-3000:]
        assert built.stdout.strip() == tag
        assert "fibercore from this Python's" in built.stderr and "fibercore 0." in built.stderr, built.stderr[:2000]
        readme = (CHECKOUT / "plugins" / "fiber_docker" / "README.md").read_text()
        program = readme.split("cat > squares.py <<'PY'\n", 1)[1].split("\nPY\n", 1)[0]  # the page's own program
        (tmp_path / "squares.py").write_text(program + "\n")
        run = subprocess.run([python, "squares.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                             env={**env, "FIBER_BACKEND": "docker", "FIBER_IMAGE": tag})
        assert run.returncode == 0, run.stderr[-3000:]
        assert run.stdout.strip() == "[(0, True), (1, True), (4, True), (9, True)]", run.stdout
        assert "# [(0, True), (1, True), (4, True), (9, True)]" in readme
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


@pytest.mark.parametrize("args, message", [
    (["--wheels", "{tmp}"], "no fibercore wheel in"),
    (["-r", "{tmp}/nothere.txt"], "-r {tmp}/nothere.txt: No such file or directory"),
    (["--base", "fibercore-test/no-such-base:0"], "the base image 'fibercore-test/no-such-base:0' is not on this"),
    (["--wheels", "{tmp}", "--index"], "not allowed with argument"),
])
def test_image_builder_errors_are_one_line_naming_the_fix(docker_client: Any, tmp_path: Path, args: list[str],
                                                          message: str) -> None:
    done = subprocess.run([sys.executable, "-m", "fiber_docker.image", *(a.format(tmp=tmp_path) for a in args)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode in (1, 2), done
    lines = done.stderr.strip().splitlines()
    assert message.format(tmp=tmp_path) in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith(("error:", "python -m fiber_docker.image: error:")), lines
