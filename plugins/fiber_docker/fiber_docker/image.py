"""Build the worker image the docker backend runs: ``python -m fiber_docker.image``.

The image is ``BASE`` (default ``python:<this Python's major.minor>-slim``: pickled functions
do not cross Python minor versions; any local image with ``python3`` and its ``venv`` module
works) plus a venv at ``/opt/fiber`` on PATH with fibercore, its plugins installed here and
your requirements. Where fibercore comes from:

* by default, from what this Python runs: the checkout fibercore is imported from (an
  editable install, or ``PYTHONPATH``), else a wheel of each fibercore distribution installed
  here, made from its installed files (so a venv made from ``scripts/wheels``' ``dist/`` needs
  nothing else); the image runs exactly the master's code;
* ``--source CHECKOUT``: wheels built from a fibercore checkout (the core and every plugin);
* ``--wheels DIR``: the fibercore wheels in ``DIR`` (``scripts/wheels`` writes them to ``dist/``);
* ``--index``: the versions installed here, from the package index.

The other packages fibercore needs come from the package index, pinned to the versions
installed here (``--constraints FILE`` instead: its pins; an empty file pins nothing).

``--content-tag REPO`` names the image ``REPO:<hash>`` of everything that goes into
it (base image id, Dockerfile, requirements, pins, fibercore's files) and skips the build
when that image exists: the test suite builds its image once per change of the code.

Examples::

    python -m fiber_docker.image                                # fibercore-worker:latest
    python -m fiber_docker.image --tag me/rl:1 -r requirements.txt
    python -m fiber_docker.image --wheels dist/ --base my-python:3.11
    python -m fiber_docker.image --base my-base:1 --source . --content-tag fibercore-test/worker
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import zipfile
from collections.abc import Iterable, Iterator
from importlib import metadata, resources
from pathlib import Path
from typing import Any

from fiber_docker import DEFAULT_IMAGE
from fibercore.errors import FiberError

DEFAULT_TAG = DEFAULT_IMAGE
DEFAULT_BASE = f"python:{sys.version_info.major}.{sys.version_info.minor}-slim"
_OWN_DISTS = {"fibercore", "fiber-local", "fiber-docker", "fiber-k8s", "fiber-aws", "fiber-slurm", "fiber-ssh",
              "fiber-nng"}
_SKIP_DIRS = {"__pycache__", "tests", "build", "dist", ".venv", ".git", ".pytest_cache", ".ruff_cache"}


def _project(name: str) -> str:
    """A distribution's name as :data:`_OWN_DISTS` spells it (``fiber_docker`` -> ``fiber-docker``)."""
    return name.lower().replace("_", "-")


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
        if _project(project) not in _OWN_DISTS:
            out.append(req)
    return out


def _copy_sources(source: Path, into: Path) -> list[Path]:
    """Copy exactly the hashed files of each distribution (the build writes build/ and
    egg-info next to its sources: not in the user's checkout)."""
    return [_copy_dist(dist, into / (dist.name if i else "fibercore-src"), is_root=(i == 0))
            for i, dist in enumerate(source_distributions(source))]


def _copy_dist(dist: Path, target: Path, is_root: bool) -> Path:
    for path in _source_files(dist, is_root):
        dest = target / path.relative_to(dist)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest)
    return target


def _pip_wheel(directory: Path, into: Path, is_root: bool) -> None:
    """Build the wheel of one distribution's directory into ``into``, from a copy of exactly
    its source files (a build writes build/ and egg-info beside its sources: not in the user's
    directory)."""
    with tempfile.TemporaryDirectory(prefix="fiber-src-") as tmp:
        _run_pip_wheel([_copy_dist(directory, Path(tmp) / directory.name, is_root)], into, directory)


def _run_pip_wheel(dists: list[Path], into: Path, origin: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
           "-w", str(into), *map(str, dists)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise ImageBuildError(
            f"building wheels from {origin} failed (pip wheel, exit {done.returncode}): it builds with this "
            f"Python's setuptools ({_version_or_none('setuptools')}; the checkout needs >= 77) and wheel "
            f"({_version_or_none('wheel')}): `{sys.executable} -m pip install -U 'setuptools>=77' wheel`, or "
            f"pass --wheels DIR (scripts/wheels writes dist/)\n{done.stdout}{done.stderr}"
        )


def _version_or_none(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "none installed"


def wheel_requirements(directory: Path) -> list[str]:
    """The third-party requirements of the wheels in ``directory`` (each once, in order)."""
    requirements: list[str] = []
    for wheel in sorted(directory.glob("*.whl")):
        for req in _wheel_requirements(wheel):
            if req not in requirements:
                requirements.append(req)
    return requirements


def build_wheels(source: Path, into: Path) -> list[str]:
    """Build the checkout's wheels into ``into``; return their third-party requirements."""
    with tempfile.TemporaryDirectory(prefix="fiber-src-") as tmp:
        _run_pip_wheel(_copy_sources(source, Path(tmp)), into, source)
    return wheel_requirements(into)


def checkout_in_use() -> Path | None:
    """The fibercore checkout this Python imports fibercore from (an editable install, or
    ``PYTHONPATH``), or None (an installed wheel)."""
    import importlib.util

    spec = importlib.util.find_spec("fibercore")
    if spec is None or spec.origin is None:
        return None
    root = Path(spec.origin).resolve().parent.parent
    try:
        source_distributions(root)
    except ImageBuildError:
        return None
    if _found_only_through_cwd(root):
        return None
    return root


def _found_only_through_cwd(root: Path) -> bool:
    """True when ``root`` is importable only because Python put the current directory first
    (``python -m`` run inside a checkout) while fibercore is installed here from a wheel, or in
    place from another checkout: the user's programs, run from anywhere else, use the installed
    one, so the image takes it."""
    if Path.cwd().resolve() != root:
        return False
    pythonpath = [Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if root in pythonpath:
        return False
    for dist in metadata.distributions(name="fibercore"):
        where = Path(str(dist.locate_file(""))).resolve()
        editable = _editable_dir(dist)
        if where != root and (editable is None or editable.resolve() != root):
            return True  # installed from a wheel, or in place from another checkout
    return False


def _editable_dir(dist: metadata.Distribution) -> Path | None:
    """The directory a distribution was installed from in place (``pip install -e DIR``), if it was."""
    text = dist.read_text("direct_url.json")
    if not text:
        return None
    try:
        info = json.loads(text)
    except ValueError:
        return None
    url = urllib.parse.urlparse(str(info.get("url", "")))
    if info.get("dir_info", {}).get("editable") and url.scheme == "file":
        return Path(urllib.parse.unquote(url.path))
    return None


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: metadata.Distribution, into: Path) -> Path:
    """A wheel of an installed (not editable) distribution, from its installed files: what pip
    wrote for it under site-packages (scripts are made again by the installing pip)."""
    files = [f for f in dist.files or () if f.parts and f.parts[0] != ".." and "__pycache__" not in f.parts]
    info = next((f.parts[0] for f in files if f.parts[0].endswith(".dist-info")), None)
    if info is None:
        raise ImageBuildError(f"{dist.metadata['Name']} is installed without a .dist-info listing its files: "
                              "reinstall it with pip, or use --wheels DIR / --source CHECKOUT")
    wheel_text = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_text.splitlines() if line.startswith("Tag:")]
    name = info[: -len(".dist-info")]  # already the wheel's name-version form
    path = into / f"{name}-{_compressed(tags)}.whl"
    records = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for f in files:
            rel = f.as_posix()
            if f.parts[0] == info and f.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue  # written by the installer, per install
            data = Path(str(f.locate())).read_bytes()
            _add(zf, rel, data)
            records.append(f"{rel},{_record_hash(data)},{len(data)}")
        records.append(f"{info}/RECORD,,")
        _add(zf, f"{info}/RECORD", ("\n".join(records) + "\n").encode())
    return path


def _compressed(tags: list[str]) -> str:
    """A wheel file name's tag part for ``tags`` (``py2-none-any`` and ``py3-none-any``:
    ``py2.py3-none-any``)."""
    if not tags:
        return "py3-none-any"
    fields: list[dict[str, None]] = [{}, {}, {}]
    for tag in tags:
        for i, part in enumerate(tag.split("-", 2)):
            fields[i][part] = None
    return "-".join(".".join(field) for field in fields)


def _add(zf: zipfile.ZipFile, name: str, data: bytes) -> None:
    """One member with a fixed time: the same files make the same wheel, bytes for bytes
    (``--content-tag`` hashes it)."""
    member = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    member.external_attr = 0o644 << 16
    member.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(member, data)


def installed_fibercore() -> list[metadata.Distribution]:
    """The fibercore distributions installed in this Python (the core, its plugins)."""
    found = []
    for name in sorted(_OWN_DISTS):
        candidates = list(metadata.distributions(name=name))
        # An installation has a RECORD; a build's .egg-info in the current directory (which
        # ``python -m`` inside a checkout puts first on sys.path) is not one.
        installed = [d for d in candidates if d.read_text("RECORD") is not None] or candidates[:1]
        found.extend(installed[:1])
    return found


def wheels_of_this_python(into: Path) -> str:
    """A wheel of each fibercore distribution installed here into ``into``: built from its
    directory when installed in place, else made from its installed files. Returns what it
    did, for the log."""
    made = []
    for dist in installed_fibercore():
        directory = _editable_dir(dist)
        if directory is not None and directory.is_dir():
            _pip_wheel(directory, into, is_root=dist.metadata["Name"] == "fibercore")
            made.append(f"{dist.metadata['Name']} from {directory}")
        else:
            repack(dist, into)
            made.append(f"{dist.metadata['Name']} {dist.version}")
    if not any(w.name.startswith("fibercore-") for w in into.glob("*.whl")):
        raise ImageBuildError("fibercore is not installed as a distribution in this Python: pass --source "
                              "CHECKOUT or --wheels DIR (scripts/wheels writes dist/)")
    return "this Python's " + ", ".join(made)


def own_wheels(directory: Path) -> list[Path]:
    """The fibercore wheels of ``directory`` (``scripts/wheels``' ``dist/``); one must be the core's."""
    own = [w for w in sorted(directory.glob("*.whl"))
           if _project(w.name.split("-")[0]) in _OWN_DISTS]
    if not any(w.name.startswith("fibercore-") for w in own):
        raise ImageBuildError(f"no fibercore wheel in {directory}: build them with scripts/wheels (into dist/), "
                              "or leave out --wheels to use what this Python has installed")
    return own


def copy_wheels(directory: Path, into: Path) -> str:
    """The fibercore wheels of ``directory``, copied into ``into``."""
    own = own_wheels(directory)
    for wheel in own:
        shutil.copyfile(wheel, into / wheel.name)
    return "wheels " + ", ".join(w.name for w in own)


#: A public PEP 440 version (what an index serves): a pin of anything else would make pip
#: refuse the whole constraints file.
_PUBLIC_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


def installed_constraints() -> str:
    """``name==version`` of every distribution of this environment (``sys.prefix``) but
    fibercore's own and those installed from a directory: the image gets the versions the
    master runs. A local label is dropped (``torch==2.13.0+cpu`` pins ``2.13.0``, which the
    index has and which the installed build also matches); a version no index could serve
    (a distribution's own build label) is left unpinned."""
    prefix = Path(sys.prefix).resolve()
    pins: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").strip()
        key = _project(name)
        if not name or key in _OWN_DISTS or key == "pip" or dist.read_text("direct_url.json"):
            continue
        if not Path(str(dist.locate_file(""))).resolve().is_relative_to(prefix):
            continue  # a system or user site's package, not this environment's
        version = dist.version.split("+", 1)[0]
        if _PUBLIC_VERSION.match(version):
            pins.setdefault(key, f"{name}=={version}")
    return "".join(f"{pins[k]}\n" for k in sorted(pins))


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


def _text(path: str | Path | None, option: str) -> str:
    """A file an option names, read; ImageBuildError naming the option when it cannot be."""
    if not path:
        return ""
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ImageBuildError(f"{option} {path}: {exc.strerror or exc}") from None


def _base_image(client: Any, base: str, out: Any) -> Any:
    """The base image; the default one (the official Python image) is pulled when missing."""
    import docker

    try:
        return client.images.get(base)
    except docker.errors.ImageNotFound:
        if base != DEFAULT_BASE:
            raise
    out(f"fiber_docker.image: pulling {base}\n")
    try:
        return client.images.pull(base)
    except docker.errors.APIError:
        raise docker.errors.ImageNotFound(base) from None


def build_image(
    tag: str | None = None,
    *,
    base: str = DEFAULT_BASE,
    source: str | Path | None = None,
    wheels: str | Path | None = None,
    index: bool = False,
    requirements: str | Path | None = None,
    constraints: str | Path | None = None,
    content_tag: str | None = None,
    ca_bundle: str | None = None,
    network_mode: str = "host",
    log: Any = None,
) -> str:
    """Build (or, with ``content_tag``, reuse) the worker image; return its tag.

    fibercore comes from ``source`` (a checkout), ``wheels`` (a directory of its wheels), the
    package index (``index``), or by default from what this Python runs (the module docstring).
    ``constraints``: a pip constraints file (``name==version`` lines) every install in the
    image obeys (default: the versions installed here), so the same inputs give the same image
    whenever it is built."""
    import docker

    if sum(x is not None and x is not False for x in (source, wheels, index or None)) > 1:
        raise ImageBuildError("--source, --wheels and --index each say where fibercore comes from: give one")
    if wheels is not None:
        own_wheels(Path(wheels))  # the inputs are checked before anything is asked of Docker
    user_reqs = [r.strip() for r in _text(requirements, "-r").splitlines()
                 if r.strip() and not r.lstrip().startswith("#")]
    pins = _text(constraints, "-c") if constraints else installed_constraints()
    ca = ca_bundle if ca_bundle is not None else _default_ca_bundle()
    if ca:
        _text(ca, "--ca-bundle")
    out = log or (lambda text: sys.stderr.write(text))
    try:
        client = docker.from_env()
        client.ping()
    except docker.errors.DockerException as exc:
        from fiber_docker.engine import explain_unreachable

        raise ImageBuildError(str(explain_unreachable(exc))) from None
    try:
        base_id = _base_image(client, base, out).id
    except docker.errors.ImageNotFound:
        raise ImageBuildError(
            f"the base image {base!r} is not on this Docker host (nor could it be pulled). Pull it "
            f"(`docker pull {base}`) or pass --base with a local image that has python3 and its venv module "
            f"(Debian/Ubuntu based), of this Python's version ({sys.version_info.major}.{sys.version_info.minor})."
        ) from None
    src = Path(source).resolve() if source is not None else (None if wheels or index else checkout_in_use())
    dockerfile = dockerfile_text()
    with tempfile.TemporaryDirectory(prefix="fiber-image-") as tmp:
        ctx = Path(tmp)
        into = ctx / "wheels"
        into.mkdir()
        (into / ".keep").write_text("")
        if src is not None:
            reqs, origin = build_wheels(src, into), f"source {src}"
        elif index:
            reqs, origin = installed_requirements(), "the package index"
        else:
            origin = copy_wheels(Path(wheels), into) if wheels else wheels_of_this_python(into)
            reqs = wheel_requirements(into)
        reqs = [*reqs, *user_reqs]
        if content_tag:
            made = [] if src is not None else [hashlib.sha256(w.read_bytes()).hexdigest()
                                               for w in sorted(into.glob("*.whl"))]
            digest = content_hash([base_id, dockerfile, "\n".join(reqs), pins, *made], src)
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
        out(f"fiber_docker.image: building {tag} from {base}, fibercore from {origin}\n")
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
    parser.add_argument("--base", default=DEFAULT_BASE,
                        help=f"a local image with python3 and its venv module (default {DEFAULT_BASE})")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--source", default=None, metavar="CHECKOUT",
                       help="fibercore from this checkout (default: what this Python runs)")
    where.add_argument("--wheels", default=None, metavar="DIR",
                       help="fibercore from the wheels in DIR (scripts/wheels writes dist/)")
    where.add_argument("--index", action="store_true",
                       help="fibercore's installed versions from the package index")
    parser.add_argument("--requirements", "-r", default=None, help="a requirements file for your own code")
    parser.add_argument("--constraints", "-c", default=None,
                        help="a pip constraints file (name==version) every install obeys "
                             "(default: the versions installed here; an empty file pins nothing)")
    parser.add_argument("--content-tag", default=None, metavar="REPO",
                        help="tag REPO:<content hash>, and reuse it when it exists")
    parser.add_argument("--ca-bundle", default=None, help="CA bundle pip uses inside the build (default $PIP_CERT)")
    parser.add_argument("--network", default="host", help="network of the build's RUN steps (default host)")
    args = parser.parse_args(argv)
    try:
        tag = build_image(args.tag, base=args.base, source=args.source, wheels=args.wheels, index=args.index,
                          requirements=args.requirements, constraints=args.constraints,
                          content_tag=args.content_tag, ca_bundle=args.ca_bundle, network_mode=args.network)
    except ImageBuildError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 1
    print(tag)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
