"""Every docker_* option and JobSpec field, as mapped (unit) and as Docker applies it (real dockerd)."""

from __future__ import annotations

import os
import stat
import time
from typing import Any

import docker_tasks
import pytest
from docker_helpers import RUN_LABEL
from fiber_docker.options import (
    SECRET_TARGET,
    DockerOptionError,
    build_request,
    container_name,
    exit_code,
    network_gateway,
    parse_labels,
    parse_volumes,
)
from hypothesis import given
from hypothesis import strategies as st

import fibercore as fc
from fibercore import ProcessError
from fibercore.types import JobSpec

# -- the mapping, without Docker ------------------------------------------------------------


def _spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {
        "args": ["-m", "fibercore.worker"],
        "session": "0123456789ab",
        "env": {"FIBER_SESSION": "s1"},
        "secret_env": {"FIBER_SECRET": "ab" * 32},
        "name": "Process-1",
        "image": "img:1",
        "labels": {"fiber-session": "s1", "fiber-process": "Process-1"},
        "cwd": "/work/project",
    }
    base.update(kw)
    return JobSpec(**base)


def _request(spec: JobSpec | None = None, **cfg: Any) -> Any:
    return build_request(spec or _spec(), cfg, name="n", labels={"fiber-backend": "docker"},
                         secret_source="/tmp/x/secret-s1", docker_socket="/var/run/docker.sock")


def test_command_uses_the_images_python_unless_python_exe_is_set() -> None:
    assert _request().command == ["python", "-m", "fibercore.worker"]
    custom = _spec(python="/opt/py/bin/python")
    assert _request(custom).command[0] == "/opt/py/bin/python"


def test_resources_map_to_docker_limits() -> None:
    hc = _request(_spec(cpu=1.5, memory=512, gpu=2)).host_config
    assert hc["nano_cpus"] == 1_500_000_000
    assert hc["mem_limit"] == 512 * 1024 * 1024
    assert hc["device_requests"] == [{"count": 2, "capabilities": [["gpu"]]}]
    bare = _request().host_config
    assert "nano_cpus" not in bare and "mem_limit" not in bare and "device_requests" not in bare


def test_secret_is_a_mounted_file_not_an_environment_variable() -> None:
    req = _request()
    assert "FIBER_SECRET" not in req.environment
    assert req.environment["FIBER_SECRET_FILE"] == SECRET_TARGET
    assert req.host_config["binds"]["/tmp/x/secret-s1"] == {"bind": SECRET_TARGET, "mode": "ro"}
    no_file = build_request(_spec(), {}, name="n", labels={}, secret_source=None, docker_socket=None)
    assert no_file.environment["FIBER_SECRET"] == "ab" * 32  # only when no file can be used


def test_volumes_cwd_socket_network_user_and_labels() -> None:
    req = _request(docker_volumes="/data:/data:ro,/scratch:/s", docker_labels="team=rl,exp=7",
                   docker_user="1000:1000", docker_network="bridge", docker_shm_size="1g", docker_nested=True)
    binds = req.host_config["binds"]
    assert binds["/data"] == {"bind": "/data", "mode": "ro"}
    assert binds["/scratch"] == {"bind": "/s", "mode": "rw"}
    assert binds["/work/project"] == {"bind": "/work/project", "mode": "rw"}
    assert binds["/var/run/docker.sock"]["bind"] == "/var/run/docker.sock"
    assert req.working_dir == "/work/project"
    assert req.user == "1000:1000"
    assert req.host_config["network_mode"] == "bridge"
    assert req.host_config["shm_size"] == "1g"
    assert req.labels == {"team": "rl", "exp": "7", "fiber-session": "s1", "fiber-process": "Process-1",
                          "fiber-backend": "docker"}
    quiet = _request(docker_mount_cwd=False, docker_nested=False, docker_workdir="/w")
    assert "/work/project" not in quiet.host_config["binds"]
    assert "/var/run/docker.sock" not in quiet.host_config["binds"] and "DOCKER_HOST" not in quiet.environment
    assert quiet.working_dir == "/w"
    assert _request().host_config["init"] is True and _request().host_config["auto_remove"] is True


@pytest.mark.parametrize("text, fix", [
    ("/data", "HOST_PATH:CONTAINER_PATH"),
    ("/a:/b:rx", "ro or rw"),
    ("data:/data", "absolute"),
])
def test_bad_volumes_say_the_expected_form(text: str, fix: str) -> None:
    with pytest.raises(DockerOptionError, match=fix):
        parse_volumes(text)


def test_bad_labels_say_the_expected_form() -> None:
    with pytest.raises(DockerOptionError, match="KEY=VALUE"):
        parse_labels("team")
    assert parse_labels(" a=1 , b = 2 ") == {"a": "1", "b": "2"}


def test_no_image_is_a_clear_error() -> None:
    with pytest.raises(DockerOptionError, match="FIBER_IMAGE"):
        _request(_spec(image=None))


@given(st.integers(min_value=0, max_value=255))
def test_exit_codes_follow_multiprocessing(status: int) -> None:
    code = exit_code(status)
    if 129 <= status <= 192:
        assert code == -(status - 128)
    else:
        assert code == status


@given(st.text(min_size=0, max_size=80))
def test_container_names_are_valid_docker_names(process_name: str) -> None:
    import re

    name = container_name("0123456789abcdef", process_name, "a1b2c3")
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", name)


# -- as the real dockerd applies them -----------------------------------------------------------


@pytest.fixture
def docker_backend(docker_config: dict[str, Any], fiber_backend_init: Any) -> Any:
    return lambda **extra: fiber_backend_init(backend="docker", **{**docker_config, **extra})


def test_meta_limits_are_applied_to_the_container(docker_backend: Any, docker_client: Any) -> None:
    docker_backend()
    q = fc.Queue()
    target = fc.meta(cpu=0.5, memory=256)(docker_tasks.container_facts)
    p = fc.Process(target=target, args=(q,))
    p.start()
    facts = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    assert facts["in_container"] and facts["cwd"] == os.getcwd()
    quota = facts["cfs_quota"].split()[0]
    assert int(quota) == 50_000  # 0.5 CPU of a 100 ms period
    assert int(facts["mem_limit"]) == 256 * 1024 * 1024


def test_labels_secret_and_host_pid(docker_backend: Any, docker_client: Any) -> None:
    docker_backend()
    p = fc.Process(target=docker_tasks.hold, args=(30,), name="labelled")
    p.start()
    try:
        info = docker_client.api.inspect_container(p.job.data.cid)
        labels = info["Config"]["Labels"]
        assert labels["fiber-session"] == fc.get_runtime().session
        assert labels["fiber-process"] == "labelled"
        assert RUN_LABEL.split("=")[0] in labels
        env = info["Config"]["Env"]
        secret = fc.get_runtime().secret.hex()
        assert not any(secret in e for e in env), "the session secret is readable in docker inspect"
        assert f"FIBER_SECRET_FILE={SECRET_TARGET}" in env
        mount = next(m for m in info["Mounts"] if m["Destination"] == SECRET_TARGET)
        assert mount["RW"] is False
        mode = os.stat(mount["Source"]).st_mode
        assert stat.S_IMODE(os.stat(os.path.dirname(mount["Source"])).st_mode) == 0o700
        assert not mode & stat.S_IWUSR
        assert p.pid == info["State"]["Pid"]  # unique on the host, unlike the pid inside
        assert info["HostConfig"]["Init"] is True
    finally:
        p.kill()
        p.join(30)
    assert p.exitcode == -9


def test_volumes_are_mounted_read_only(docker_backend: Any, tmp_path: Any) -> None:
    (tmp_path / "input.txt").write_text("from the host")
    docker_backend(docker_volumes=f"{tmp_path}:/data:ro")
    q = fc.Queue()
    p = fc.Process(target=docker_tasks.read_and_write, args=("/data/input.txt", q))
    p.start()
    assert q.get(timeout=60) == ("from the host", False)
    p.join(60)
    assert p.exitcode == 0


def test_missing_image_says_how_to_build_it(docker_backend: Any) -> None:
    docker_backend(image="fibercore-test/no-such-image:0")
    p = fc.Process(target=docker_tasks.hold, args=(0,))
    with pytest.raises(ProcessError) as info:
        p.start()
    text = str(info.value)
    assert "fibercore-test/no-such-image:0" in text and "does not exist on this Docker host" in text
    assert "python -m fiber_docker.image --tag fibercore-test/no-such-image:0" in text


MISSING_IMAGE_PROGRAMS = {
    "Process": "import fibercore as mp\nif __name__ == '__main__':\n"
               "    p = mp.Process(target=print, args=('hi',))\n    p.start()\n    p.join()\n",
    "Pool": "import fibercore as mp\nif __name__ == '__main__':\n"
            "    with mp.Pool(2) as pool:\n        print(pool.map(abs, [-1, -2]))\n",
}


@pytest.mark.parametrize("kind", sorted(MISSING_IMAGE_PROGRAMS))
def test_a_program_on_a_missing_image_ends_with_one_line_naming_the_fix(docker_client: Any, tmp_path: Any,
                                                                          kind: str) -> None:
    """A newcomer's Process or Pool with no image built: one line on stderr with the command that
    builds it (it was 43 lines for a Process, 55 after seconds of retries for a Pool), exit 1."""
    import subprocess
    import sys

    (tmp_path / "app.py").write_text(MISSING_IMAGE_PROGRAMS[kind])
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FIBER_")},
           "FIBER_BACKEND": "docker", "FIBER_IMAGE": "fibercore-test/no-such-image:0"}
    done = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and done.stdout == "", done
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "python -m fiber_docker.image --tag fibercore-test/no-such-image:0" in lines[0], lines
    assert lines[0].count("does not exist on this Docker host") == 1, lines


def test_unreachable_daemon_says_what_to_do(docker_config: dict[str, Any], tmp_path: Any) -> None:
    from fiber_docker.engine import Engine
    from fiber_docker.plugin import plugin

    with pytest.raises(Exception) as info:
        Engine(f"unix://{tmp_path}/no-docker.sock")
    assert "cannot reach the Docker daemon" in str(info.value) and "DOCKER_HOST" in str(info.value)
    assert plugin.engine(fc.get_config()) is not None  # the process's engine is unaffected


def test_kept_containers_are_removed_by_cleanup(docker_backend: Any, docker_client: Any) -> None:
    docker_backend(docker_remove=False)
    p = fc.Process(target=docker_tasks.hold, args=(0,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    session = fc.get_runtime().session
    name = p.job.data.name
    deadline = time.monotonic() + 10
    while True:  # Docker's listing follows its die event by a moment
        kept = docker_client.api.containers(all=True, filters={"name": name})
        if [c["State"] for c in kept] == ["exited"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert [c["State"] for c in kept] == ["exited"]
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "fibercore.cli", "cleanup", "--backend", "docker",
                           "--session", session], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"removed 1 job(s) of session {session} on backend docker" in done.stdout
    assert docker_client.api.containers(all=True, filters={"label": f"fiber-session={session}"}) == []


def test_out_of_memory_is_a_sigkill_with_an_explanation(docker_backend: Any) -> None:
    docker_backend()
    p = fc.Process(target=fc.meta(memory=64)(docker_tasks.eat_memory), args=(400,))
    p.start()
    p.join(90)
    assert p.exitcode == -9
    deadline = time.monotonic() + 10
    while "OOM killer" not in p.logs() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "OOM killer" in p.logs()


def test_gpu_request_reaches_docker(docker_client: Any, docker_image: str) -> None:
    """No GPU runtime here: create (not start) a container from the mapping and read it back."""
    req = build_request(_spec(image=docker_image, gpu=1), {}, name=f"fiber-gpu-check-{os.getpid()}",
                        labels={"fiber-test-run": RUN_LABEL.split("=")[1]}, secret_source=None, docker_socket=None)
    api = docker_client.api
    created = api.create_container(req.image, command=req.command, name=req.name, labels=req.labels,
                                   host_config=api.create_host_config(**req.host_config))
    try:
        requests = api.inspect_container(created["Id"])["HostConfig"]["DeviceRequests"]
        assert requests[0]["Count"] == 1 and requests[0]["Capabilities"] == [["gpu"]]
    finally:
        api.remove_container(created["Id"], force=True)


def test_bridge_network_master_listens_on_the_gateway(docker_backend: Any) -> None:
    """Bridge mode: jobs reach the master at the bridge's gateway (traffic stays between
    this host and its own containers)."""
    docker_backend(docker_network="bridge")
    rt = fc.get_runtime()
    q = fc.Queue()
    p = fc.Process(target=docker_tasks.container_facts, args=(q,))
    p.start()
    facts = q.get(timeout=60)
    p.join(60)
    assert p.exitcode == 0
    info_host = facts["hostname"]
    assert info_host != os.uname().nodename  # its own network namespace, not the host's
    # The master listens where the container's own default route leads: the bridge's gateway
    # (whether or not `docker network inspect` lists it; a dockerd started without a
    # configured bridge lists only the subnet).
    assert rt.listen_host == facts["default_gateway"]


_BRIDGE = {"Driver": "bridge", "Id": "0123456789abcdef",
           "Options": {"com.docker.network.bridge.name": "docker0"}}


def test_gateway_as_reported_by_ipam() -> None:
    info = {**_BRIDGE, "IPAM": {"Config": [{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}]}}
    assert network_gateway(info, lambda name: "10.9.9.9") == "172.17.0.1"


def test_gateway_missing_from_ipam_is_the_bridge_interfaces_address() -> None:
    """dockerd started without a configured bridge: IPAM lists only the subnet."""
    info = {**_BRIDGE, "IPAM": {"Config": [{"Subnet": "172.18.0.0/16"}]}}
    asked: list[str] = []
    assert network_gateway(info, lambda name: asked.append(name) or "172.18.0.1") == "172.18.0.1"
    assert asked == ["docker0"]
    user_defined = {"Driver": "bridge", "Id": "0123456789abcdef", "Options": {},
                    "IPAM": {"Config": [{"Subnet": "10.5.0.0/24"}]}}
    network_gateway(user_defined, lambda name: asked.append(name))
    assert asked[-1] == "br-0123456789ab"


def test_gateway_without_interface_is_the_subnets_first_host() -> None:
    """A remote daemon (no such interface here): Docker's default IPAM choice."""
    info = {**_BRIDGE, "IPAM": {"Config": [{"Subnet": "fd00::/64"}, {"Subnet": "10.7.0.0/16"}]}}
    assert network_gateway(info, lambda name: None) == "10.7.0.1"
    assert network_gateway({"Driver": "bridge", "IPAM": {"Config": []}}, lambda name: None) is None


def test_output_is_echoed_to_the_master(docker_backend: Any, capfd: Any) -> None:
    """Like the local backend (and multiprocessing), a job's prints show up in the master."""
    from fibercore.testing.targets import print_marker

    docker_backend(docker_echo_output=True)
    marker = f"echo-marker-{os.getpid()}-{time.time_ns()}"
    p = fc.Process(target=print_marker, args=(marker,))
    p.start()
    p.join(60)
    assert p.exitcode == 0
    time.sleep(0.2)
    out, err = capfd.readouterr()
    assert f"{marker}\n" in out and f"{marker}-stderr" in err


def test_terminate_without_an_init_still_ends_the_job(docker_backend: Any) -> None:
    """The worker is PID 1 then; it handles SIGTERM itself (PID 1 ignores default actions)."""
    docker_backend(docker_init=False)
    p = fc.Process(target=docker_tasks.hold, args=(60,))
    p.start()
    t0 = time.monotonic()
    p.terminate()
    p.join(30)
    assert p.exitcode == -15 and time.monotonic() - t0 < 10
