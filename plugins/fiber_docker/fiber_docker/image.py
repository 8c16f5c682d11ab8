"""Build the worker image the docker backend runs: ``python -m fiber_docker.image``.

The image is ``BASE`` (default ``python:3.11-slim``; match the master's Python minor
version, pickled functions do not cross it) plus a venv at ``/opt/fiber`` on PATH
with fibercore, fiber-docker and your requirements. Two ways to get fibercore in:

* from the package index, the versions installed here (default);
* ``--source CHECKOUT``: wheels built here from a fibercore checkout (the core and
  every plugin under ``plugins/``), so the image runs exactly this code.

``--content-tag REPO`` names the image ``REPO:<hash>`` of everything that goes into
it (base image id, Dockerfile, requirements, source files) and skips the build when
that image exists: the test suite builds its image once per change of the code.

Examples::

    python -m fiber_docker.image                                # fibercore-worker:latest
    python -m fiber_docker.image --tag me/rl:1 -r requirements.txt
    python -m fiber_docker.image --base my-base:1 --source . --content-tag fibercore-test/worker
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from fiber_docker import DEFAULT_IMAGE
from fibercore.errors import FiberError

DEFAULT_TAG = DEFAULT_IMAGE
DEFAULT_BASE = "python:3.11-slim"
_OWN_DISTS = {"fibercore", "fiber-local", "fiber-docker", "fiber-k8s", "fiber-aws", "fiber-slurm", "fiber-ssh",
              "fiber-nng"}
_SKIP_DIRS = {"__pycache__", "tests", "build", "dist", ".venv", ".git", ".pytest_cache", ".ruff_cache"}


class ImageBuildError(RuntimeError, FiberError):
    """The image could not be built or pushed; the message says which step and why."""


def dockerfile_text() -> str:
    return resources.files("fiber_docker").joinpath("Dockerfile").read_text()


def source_distributions(source: Path) -> list[Path]:
    """The distributions of a fibercore checkout: the core, then each plugin."""
    if not (source / "pyproject.toml").is_file() or not (source / "fibercore").is_dir():
        raise ImageBuildError(f"{source} is not a fibercore checkout (no pyproject.toml and fibercore/)")
    plugins = sorted(p for p in (source / "plugins").glob("*") if (p / "pyproject.toml").is_file())
    return [source, *plugins]


def _source_files(dist: Path, is_root: bool) -> Iterator[Path]:
    roots = [dist / "pyproject.toml", dist / "README.md", dist / "fibercore"] if is_root else [dist]
    for root in roots:
        if root.is_file():
            yield root
            continue
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
            for name in sorted(filenames):
                if not name.endswith((".pyc", ".pyo")):
                    yield Path(dirpath) / name


def content_hash(parts: Iterable[bytes | str], source: Path | None) -> str:
    """A short digest of what goes into the image (the source tree's files included)."""
    digest = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        digest.update(len(data).to_bytes(8, "big") + data)
    if source is not None:
        for i, dist in enumerate(source_distributions(source)):
            for path in _source_files(dist, is_root=(i == 0)):
                digest.update(str(path.relative_to(source)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _wheel_requirements(wheel: Path) -> list[str]:
    """Requires-Dist of a wheel, without extras and without this project's own dists."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(name).decode()
    out = []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = line.split(":", 1)[1].strip()
        if "extra ==" in req:
            continue
        bare = req.split(";")[0].strip()
        project = bare.replace("(", " ").split()[0]
        for sep in "<>=!~[":
            project = project.split(sep)[0]
        if project.lower().replace("_", "-") not in _OWN_DISTS:
            out.append(req)
    return out


def _copy_sources(source: Path, into: Path) -> list[Path]:
    """Copy exactly the hashed files of each distribution (the build writes build/ and
    egg-info next to its sources: not in the user's checkout)."""
    copies = []
    for i, dist in enumerate(source_distributions(source)):
        target = into / (dist.name if i else "fibercore-src")
        for path in _source_files(dist, is_root=(i == 0)):
            dest = target / path.relative_to(dist)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        copies.append(target)
    return copies


def build_wheels(source: Path, into: Path) -> list[str]:
    """Build the checkout's wheels into ``into``; return their third-party requirements."""
    with tempfile.TemporaryDirectory(prefix="fiber-src-") as tmp:
        dists = _copy_sources(source, Path(tmp))
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
               "-w", str(into), *map(str, dists)]
        done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageBuildError(
            f"building wheels from {source} failed (pip wheel, exit {done.returncode}); it needs "
            f"setuptools and wheel in this Python:\n{done.stdout}{done.stderr}"
        )
    requirements: list[str] = []
    for wheel in sorted(into.glob("*.whl")):
        for req in _wheel_requirements(wheel):
            if req not in requirements:
                requirements.append(req)
    return requirements


def installed_requirements() -> list[str]:
    """Pins for the fibercore distributions installed here (index mode)."""
    pins = []
    for dist in ("fibercore", "fiber-docker"):
        try:
            pins.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            pins.append(dist)
    return pins


def _default_ca_bundle() -> str | None:
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(var)
        if value and os.path.isfile(value):
            return value
    return None


def image_exists(client: Any, tag: str) -> bool:
    import docker

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def build_image(
    tag: str | None = None,
    *,
    base: str = DEFAULT_BASE,
    source: str | Path | None = None,
    requirements: str | Path | None = None,
    constraints: str | Path | None = None,
    content_tag: str | None = None,
    ca_bundle: str | None = None,
    network_mode: str = "host",
    log: Any = None,
) -> str:
    """Build (or, with ``content_tag``, reuse) the worker image; return its tag.

    ``constraints``: a pip constraints file (``name==version`` lines) every install in the
    image obeys, so the same inputs give the same image whenever it is built."""
    import docker

    out = log or (lambda text: sys.stderr.write(text))
    client = docker.from_env()
    try:
        base_id = client.images.get(base).id
    except docker.errors.ImageNotFound:
        raise ImageBuildError(
            f"the base image {base!r} is not on this Docker host. Pull it (`docker pull {base}`) "
            "or pass --base with an image that has python3 with venv (Debian/Ubuntu based)."
        ) from None
    src = Path(source).resolve() if source is not None else None
    user_reqs = Path(requirements).read_text().splitlines() if requirements else []
    user_reqs = [r.strip() for r in user_reqs if r.strip() and not r.lstrip().startswith("#")]
    pins = Path(constraints).read_text() if constraints else ""
    ca = ca_bundle if ca_bundle is not None else _default_ca_bundle()
    dockerfile = dockerfile_text()
    with tempfile.TemporaryDirectory(prefix="fiber-image-") as tmp:
        ctx = Path(tmp)
        (ctx / "wheels").mkdir()
        (ctx / "wheels" / ".keep").write_text("")
        reqs = build_wheels(src, ctx / "wheels") if src is not None else installed_requirements()
        reqs = [*reqs, *user_reqs]
        if content_tag:
            digest = content_hash([base_id, dockerfile, "\n".join(reqs), pins], src)
            tag = f"{content_tag}:{digest}"
            if image_exists(client, tag):
                out(f"fiber_docker.image: {tag} is up to date\n")
                return tag
        tag = tag or DEFAULT_TAG
        (ctx / "Dockerfile").write_text(dockerfile)
        (ctx / "requirements.txt").write_text("\n".join(reqs) + "\n")
        (ctx / "constraints.txt").write_text(pins)
        if ca:
            shutil.copyfile(ca, ctx / "build-ca.crt")
        else:
            (ctx / "build-ca.crt").write_text("")
        out(f"fiber_docker.image: building {tag} from {base} ({'source ' + str(src) if src else 'package index'})\n")
        last_error = None
        for chunk in client.api.build(path=str(ctx), tag=tag, buildargs={"BASE": base}, rm=True,
                                      forcerm=True, pull=False, network_mode=network_mode, decode=True):
            if "stream" in chunk:
                out(chunk["stream"])
            if "error" in chunk:
                last_error = chunk["error"]
        if last_error is not None or not image_exists(client, tag):
            raise ImageBuildError(f"docker build of {tag} failed: {last_error}")
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fiber_docker.image", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", "-t", default=None, help=f"image name (default {DEFAULT_TAG})")
    parser.add_argument("--base", default=DEFAULT_BASE, help=f"base image with python3 (default {DEFAULT_BASE})")
    parser.add_argument("--source", default=None, help="install fibercore from this checkout instead of the index")
    parser.add_argument("--requirements", "-r", default=None, help="a requirements file for your own code")
    parser.add_argument("--constraints", "-c", default=None,
                        help="a pip constraints file (name==version) every install obeys: a reproducible image")
    parser.add_argument("--content-tag", default=None, metavar="REPO",
                        help="tag REPO:<content hash>, and reuse it when it exists")
    parser.add_argument("--ca-bundle", default=None, help="CA bundle pip uses inside the build (default $PIP_CERT)")
    parser.add_argument("--network", default="host", help="network of the build's RUN steps (default host)")
    args = parser.parse_args(argv)
    try:
        tag = build_image(args.tag, base=args.base, source=args.source, requirements=args.requirements,
                          constraints=args.constraints,
                          content_tag=args.content_tag, ca_bundle=args.ca_bundle, network_mode=args.network)
    except ImageBuildError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    print(tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
