"""Helpers for test suites that need a real dockerd and a worker image (the docker
backend's own tests, and backends that run their jobs as containers: Batch on moto,
Kubernetes with dockershim).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_or_fail(problem: str, suite: str) -> None:
    """Skip the test with the reason, or fail it under ``CI=true`` (a skipped suite proves nothing)."""
    import pytest

    if in_ci():
        pytest.fail(f"CI=true but the {suite} tests cannot run: {problem}", pytrace=False)
    pytest.skip(problem)


def docker_problem() -> str | None:
    """Why no Docker daemon can be used here, or None when one answers."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install -e plugins/fiber_docker)"
    try:
        docker.from_env().ping()
    except Exception as exc:
        return f"no Docker daemon answers ({exc}); scripts/test starts one when run as root on Debian"
    return None


def test_image(checkout: str | Path, extra_requirements: tuple[str, ...] = ()) -> str:
    """The worker image of this checkout's code (with numpy, for the tasks the tests run on
    other hosts, and ``extra_requirements``; every version from the checkout's
    constraints.txt): ``FIBER_DOCKER_TEST_IMAGE``
    if set, else built (or reused, by content) on a local Debian base from
    ``plugins/fiber_docker/tests/image/base.sh`` (``FIBER_DOCKER_TEST_BASE`` overrides)."""
    from fiber_docker.image import build_image

    image = os.environ.get("FIBER_DOCKER_TEST_IMAGE")
    if image:
        return image
    checkout = Path(checkout)
    base = os.environ.get("FIBER_DOCKER_TEST_BASE")
    if not base:
        script = checkout / "plugins" / "fiber_docker" / "tests" / "image" / "base.sh"
        done = subprocess.run([str(script)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building the test base image failed:\n{done.stderr[-3000:]}")
        base = done.stdout.strip().splitlines()[-1]
    import tempfile

    image_dir = checkout / "plugins" / "fiber_docker" / "tests" / "image"
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as reqs:
        reqs.write((image_dir / "requirements.txt").read_text() + "".join(f"{r}\n" for r in extra_requirements))
        reqs.flush()
        return build_image(base=base, source=checkout, requirements=reqs.name,
                           constraints=checkout / "constraints.txt", content_tag="fibercore-test/worker",
                           log=lambda text: None)


test_image.__test__ = False  # type: ignore[attr-defined]  # not a pytest test


def layered_image(client: Any, worker_image: str, dockerfile_template: str, repository: str) -> str:
    """``worker_image`` with the steps of ``dockerfile_template`` (``FROM {base}`` first) on top:
    tagged ``repository:<worker image id>-<recipe hash>``, built once per worker image and recipe."""
    import hashlib
    import io

    dockerfile = dockerfile_template.format(base=worker_image).encode()
    worker_id = client.images.get(worker_image).id.split(":")[-1][:12]
    tag = f"{repository}:{worker_id}-{hashlib.sha256(dockerfile).hexdigest()[:8]}"
    try:
        client.images.get(tag)
        return tag
    except Exception:
        pass
    client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, network_mode="host", rm=True)
    return tag


class Registry:
    """A real registry (the distribution registry, Debian's ``docker-registry``) on 127.0.0.1.

    Started on a free port with its storage in ``root``; ``readonly`` makes it refuse pushes
    (its maintenance mode). :meth:`stop` stops it by its PID.
    """

    def __init__(self, root: str | Path, readonly: bool = False) -> None:
        import shutil
        import socket
        import time
        import urllib.request

        binary = shutil.which("docker-registry") or shutil.which("registry")
        if binary is None:
            raise RuntimeError("no docker-registry binary: apt-get install docker-registry (scripts/test does it as "
                               "root)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.address = f"127.0.0.1:{port}"
        root = Path(root)
        (root / "data").mkdir(parents=True, exist_ok=True)
        readonly_block = "  maintenance:\n    readonly:\n      enabled: true\n" if readonly else ""
        (root / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n  delete:\n    enabled: true\n"
            f"{readonly_block}http:\n  addr: {self.address}\n")
        self._log = open(root / "registry.log", "wb")
        self.proc = subprocess.Popen([binary, "serve", str(root / "config.yml")], stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.address}/v2/", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the registry did not start: {(root / 'registry.log').read_text()[-2000:]}")
            time.sleep(0.1)

    def tags(self, repository: str) -> list[str]:
        """The tags the registry holds for ``repository`` (its HTTP API)."""
        import json
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://{self.address}/v2/{repository}/tags/list", timeout=5) as resp:
                return list(json.load(resp).get("tags") or [])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise

    def pulls(self, repository: str) -> int:
        """Manifest requests (HEAD or GET) for ``repository`` in the access log that came from
        a daemon pulling (not from the push of the docker SDK): a pull makes one or two."""
        self._log.flush()
        lines = Path(self._log.name).read_text(errors="replace").splitlines()
        return sum(1 for line in lines
                   if re.search(rf'"(HEAD|GET) /v2/{re.escape(repository)}/manifests/', line)
                   and "docker-sdk-python" not in line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # by its PID
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def registry_fixture() -> Any:
    """A module-scoped pytest fixture yielding a running :class:`Registry` (stopped by its PID
    after the module): ``registry = registry_fixture()`` in a test module."""
    import pytest

    @pytest.fixture(scope="module")
    def registry(tmp_path_factory: Any) -> Any:
        reg = Registry(tmp_path_factory.mktemp("registry"))
        yield reg
        reg.stop()

    return registry
