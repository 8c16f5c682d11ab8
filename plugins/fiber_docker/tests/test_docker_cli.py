"""``fiber run`` and the job commands on a real dockerd, with a real registry (Debian's docker-registry)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from docker_helpers import RUN_LABEL
from fiber_docker.testing import Registry, registry_fixture

from fibercore.testing import fiber, interrupt_when, session_of, write_demo_project

registry = registry_fixture()  # Debian's docker-registry on 127.0.0.1


@pytest.fixture
def env(docker_image: str) -> dict[str, str]:
    return {"FIBER_BACKEND": "docker", "FIBER_DOCKER_LABELS": RUN_LABEL, "FIBER_IMAGE": docker_image}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_demo_project(tmp_path / "demo")



def test_run_build_push_ships_the_project_and_returns_its_exit_code(project, registry, env, no_containers_left):
    done = fiber("run", "--build", str(project), "--push", registry.address, "--", "python", "app.py", cwd=project,
                 env=env)
    assert done.returncode == 0, done.stderr
    assert "squares [0, 1, 4, 9, 16, 25] six 1.16.0" in done.stdout  # its module and its requirement
    tag = re.search(rf"{re.escape(registry.address)}/demo:([0-9a-f]+)", done.stderr).group(1)
    assert registry.tags("demo") == [tag]
    no_containers_left(session_of(done.stderr))
    again = fiber("run", "--build", str(project), "--push", registry.address, "--", "python", "app.py", "3",
                  cwd=project, env=env)
    assert again.returncode == 3 and "is up to date" in again.stderr and "squares" in again.stdout
    (project / "mylib" / "work.py").write_text("def square(x):\n    return -x\n")  # a change: a new tag
    changed = fiber("run", "--build", str(project), "--push", registry.address, "--", "python", "app.py",
                    cwd=project, env=env)
    assert changed.returncode == 0 and "squares [0, -1, -2, -3, -4, -5]" in changed.stdout
    assert len(registry.tags("demo")) == 2


def test_detached_run_is_found_by_ps_logs_cp_and_stopped(project, env, docker_image, tmp_path, no_containers_left):
    done = fiber("run", "--detach", "--build", str(project), "--", "python", "app.py", "wait", cwd=project, env=env)
    assert done.returncode == 0, done.stderr
    session = done.stdout.strip()
    assert re.fullmatch(r"[0-9a-f]+", session)
    rows: list[list[str]] = []
    for _ in range(150):
        rows = [r.split() for r in fiber("ps", "--session", session, env=env).stdout.splitlines()[1:]]
        if len([r for r in rows if r[2].startswith("Pool-") and r[3] == "running"]) == 2:
            break
    masters = [r for r in rows if r[2] == "master"]
    assert len(masters) == 1 and masters[0][3] == "running", rows
    master = masters[0][1]
    for _ in range(100):
        logs = fiber("logs", master, env=env)
        if "waiting" in logs.stdout:
            break
    assert logs.returncode == 0 and "squares [0, 1, 4, 9, 16, 25]" in logs.stdout
    assert f"==> master ({master}" in fiber("logs", session, env=env).stdout
    note = tmp_path / "note.txt"
    note.write_text("into the container")
    assert fiber("cp", str(note), f"{master}:", env=env).returncode == 0  # into /app, its working directory
    out = tmp_path / "out"
    out.mkdir()
    assert fiber("cp", f"{master}:note.txt", str(out), env=env).returncode == 0
    assert (out / "note.txt").read_text() == "into the container"
    assert fiber("cp", f"{master}:mylib", str(out / "lib"), env=env).returncode == 0
    assert (out / "lib" / "mylib" / "work.py").exists() or (out / "lib" / "work.py").exists()
    stopped = fiber("stop", session, env=env)
    assert stopped.returncode == 0 and re.match(r"stopped [123] job", stopped.stdout), stopped.stdout
    no_containers_left(session)


def test_ctrl_c_leaves_no_container(project, env, no_containers_left):
    code, out, err = interrupt_when(["run", "--build", str(project), "--", "python", "app.py", "wait"], "waiting",
                                    cwd=project, env=env)
    assert code == 130, err
    no_containers_left(session_of(err))


def test_errors_as_a_user_meets_them(project, tmp_path, env, registry, tmp_path_factory):
    empty = tmp_path / "empty"
    empty.mkdir()
    done = fiber("run", "--build", str(empty), "--", "python", "app.py", env=env)
    assert done.returncode == 2 and "is empty and has no Dockerfile: nothing to build the image from" in done.stderr
    done = fiber("run", "--build", str(project), "--base", "fibercore-test/not-there:1", "--", "python", "app.py",
                 env=env)
    assert done.returncode == 2 and "is not on this Docker host" in done.stderr and "add a Dockerfile" in done.stderr
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    done = fiber("run", "--build", str(project), "--push", closed, "--", "python", "app.py", env=env)
    assert done.returncode == 2 and "unreachable" in done.stderr, done.stderr
    readonly = Registry(tmp_path_factory.mktemp("readonly"), readonly=True)
    try:
        done = fiber("run", "--build", str(project), "--push", readonly.address, "--", "python", "app.py", env=env)
        assert done.returncode == 2 and "refused the push" in done.stderr, done.stderr
        assert readonly.tags("demo") == []
    finally:
        readonly.stop()
    (project / "Dockerfile").write_text(f"FROM {closed}/not-there:1\n")  # a base no registry serves
    done = fiber("run", "--build", str(project), "--", "python", "app.py", env=env)
    assert done.returncode == 2 and "docker build of" in done.stderr and "connection refused" in done.stderr
    assert "check the Dockerfile's FROM image" in done.stderr
    assert "Traceback" not in done.stderr


def test_doctor_and_config_with_the_real_daemon(env, docker_image):
    done = fiber("doctor", "--backend", "docker", env=env)
    assert done.returncode == 0, done.stdout
    assert "ok   Docker daemon reachable: Docker " in done.stdout
    assert f"ok   image {docker_image} present" in done.stdout
    missing = fiber("doctor", "--backend", "docker", env={**env, "FIBER_IMAGE": "fibercore-test/absent:1"})
    assert missing.returncode == 1 and "fix: build it: python -m fiber_docker.image" in missing.stdout
    shown = fiber("config", "image", "docker_labels", env=env)
    assert f"image = '{docker_image}'  (environment variable FIBER_IMAGE; fibercore)" in shown.stdout
    assert "(environment variable FIBER_DOCKER_LABELS; fiber-docker)" in shown.stdout
