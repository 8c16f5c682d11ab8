"""The docker backend's moving parts: one Docker client, one event stream, one
attached output stream per container.

- **Exit codes** come from Docker's event stream (one connection for all of this
  master's containers, filtered by a label unique to this engine), so status and
  wait never poll the API per container; the stream is opened before the first
  container starts and re-synchronised with a listing if it ever breaks.
- **Output** is read from the container's attach stream, opened *before* the
  container starts (as ``docker run`` does), so even a job that fails at once has
  its output kept (last 64 KiB) and, like the local backend, echoed to the master's
  stdout and stderr. Containers can therefore be removed by Docker itself as soon as
  they exit (``auto_remove``): nothing is left behind, even by a master that died.
- **The session secret** is a file (0444 in a 0700 directory of the master) mounted
  read-only into each container; ``docker inspect`` shows only its path.
"""

from __future__ import annotations

import os
import secrets
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from fiber_docker.options import CreateRequest, build_request, container_name, exit_code
from fibercore.backendkit import SecretFiles, clean_session, sessions_to_clean
from fibercore.errors import BackendUnavailableError

if TYPE_CHECKING:
    from fibercore.types import Check, ConfigView, Job, JobInfo, JobSpec, JobStatus

NAME = "docker"

TAIL = 64 * 1024
ENGINE_LABEL = "fiber-docker-engine"
LOST_EXIT = 255  # a container that vanished without Docker reporting its exit


class DockerUnavailable(RuntimeError, BackendUnavailableError):
    """The Docker daemon cannot be reached."""


class DockerImageNotFound(RuntimeError, BackendUnavailableError):
    """The configured image is not on the Docker host: no job starts until it is built or pulled."""


def explain_unreachable(exc: BaseException) -> DockerUnavailable:
    where = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    return DockerUnavailable(
        f"cannot reach the Docker daemon at {where}: {exc}. Start it (`sudo systemctl start "
        "docker`, or `sudo dockerd &`), make sure this user may use it (the docker group), or "
        "point DOCKER_HOST (config docker_host) at the right daemon."
    )


class ContainerJob:
    """What the engine knows about one container it started."""

    def __init__(self, cid: str, name: str) -> None:
        self.cid = cid
        self.name = name
        self.started = False
        self.status: int | None = None  # Docker's exit status once the container died
        self.lost = False
        self.oom = False
        self.exited = threading.Event()
        self.tail = bytearray()
        self.output_done = threading.Event()

    @property
    def exitcode(self) -> int | None:
        if self.status is None:
            return None
        return exit_code(self.status)

    def keep(self, chunk: bytes) -> None:
        self.tail += chunk
        if len(self.tail) > TAIL:
            del self.tail[: len(self.tail) - TAIL]


class Engine:
    """One per Docker host: the client and the streams that watch its containers."""

    def __init__(self, docker_host: str | None = None) -> None:
        import docker

        self._docker = docker
        try:
            kwargs: dict[str, Any] = {"max_pool_size": 64}
            if docker_host:
                self.client = docker.DockerClient(base_url=docker_host, **kwargs)
            else:
                self.client = docker.from_env(**kwargs)
            self.client.ping()
        except Exception as exc:
            raise explain_unreachable(exc) from exc
        self.api = self.client.api
        self.engine_id = secrets.token_hex(8)
        self.jobs: dict[str, ContainerJob] = {}
        self._lock = threading.Lock()
        # 0444: a container may run as another user (docker_user); the directory is 0700.
        self._secrets = SecretFiles(mode=0o444, prefix="fiber-docker-")
        self._closing = False
        self._since = int(time.time()) - 1
        self._events = self._subscribe()
        threading.Thread(target=self._watch, name="fiber-docker-events", daemon=True).start()

    # -- the event stream -------------------------------------------------------------
    def _subscribe(self) -> Any:
        """Open the event stream (Docker has subscribed us once this returns)."""
        return self.api.events(
            since=self._since,
            filters={"type": "container", "label": f"{ENGINE_LABEL}={self.engine_id}",
                     "event": ["die", "oom", "destroy"]},
            decode=True,
        )

    def _watch(self) -> None:
        while not self._closing:
            try:
                for event in self._events:
                    self._on_event(event)
            except Exception:
                pass
            if self._closing:
                return
            time.sleep(0.2)
            try:  # resubscribe, replaying what we missed, then catch up with a listing
                self._events = self._subscribe()
                self._resync()
            except Exception:
                time.sleep(1.0)

    def _on_event(self, event: dict[str, Any]) -> None:
        self._since = max(self._since, int(event.get("time", 0)) - 1)
        job = self.jobs.get(event.get("id", ""))
        if job is None:
            return
        action = event.get("Action") or event.get("status")
        if action == "oom":
            job.oom = True
        elif action == "die":
            code = (event.get("Actor") or {}).get("Attributes", {}).get("exitCode")
            self._finish(job, int(code) if code is not None else LOST_EXIT)
        elif action == "destroy" and job.status is None:
            job.lost = True
            self._finish(job, LOST_EXIT)

    def _resync(self) -> None:
        """After a broken event stream: ask Docker about every container still running."""
        for job in list(self.jobs.values()):
            if job.exited.is_set() or not job.started:
                continue
            try:
                state = self.api.inspect_container(job.cid)["State"]
            except self._docker.errors.NotFound:
                job.lost = True
                self._finish(job, LOST_EXIT)
                continue
            if state.get("Status") in ("exited", "dead"):
                self._finish(job, int(state.get("ExitCode", LOST_EXIT)))

    def _finish(self, job: ContainerJob, status: int) -> None:
        if job.exited.is_set():
            return
        if job.oom:
            job.keep(b"\n[fiber-docker] the container was killed by the kernel's OOM killer "
                     b"(memory limit reached; raise memory= / mem_per_job)\n")
        job.status = status
        job.exited.set()

    # -- output -----------------------------------------------------------------------
    def _pump(self, job: ContainerJob, stream: Any, echo: bool) -> None:
        out = sys.__stdout__.fileno() if sys.__stdout__ else 1
        err = sys.__stderr__.fileno() if sys.__stderr__ else 2
        try:
            for frame in stream:
                pairs = ((frame[0], out), (frame[1], err)) if isinstance(frame, tuple) else ((frame, out),)
                for chunk, fd in pairs:
                    if not chunk:
                        continue
                    job.keep(chunk)
                    if echo:
                        try:
                            os.write(fd, chunk)
                        except OSError:
                            pass
        except Exception:
            pass
        finally:
            job.output_done.set()

    # -- jobs -------------------------------------------------------------------------
    def secret_source(self, session: str, secret_hex: str) -> str:
        """A host file holding the session secret, to mount into containers."""
        inherited = os.environ.get("FIBERCORE_DOCKER_SECRET_SOURCE")
        if inherited and os.environ.get("FIBER_SESSION") == session:
            return inherited  # a job starting jobs: the master's file, by its host path
        return self._secrets.path(session, secret_hex)

    def create(self, spec: JobSpec, config: ConfigView) -> Job:
        """A container for ``spec``, created, attached to and started: the Job once it runs."""
        from fibercore.types import Job

        secret_hex = spec.secret_env.get("FIBER_SECRET")
        secret_source = self.secret_source(spec.session, secret_hex) if secret_hex and len(spec.secret_env) == 1 \
            else None
        request = build_request(
            spec, config,
            name=container_name(spec.session, spec.name, secrets.token_hex(3)),
            labels={"fiber-backend": NAME},
            secret_source=secret_source,
            docker_socket=docker_socket(config),
        )
        job = self.start(request, echo=bool(config.get("docker_echo_output", True)))
        return Job(jid=job.cid[:12], backend=NAME, data=job, host=None, pid=self.pid_of(job), spec=spec,
                   command=request.command)

    def status(self, job: ContainerJob) -> JobStatus:
        from fibercore.types import JobStatus

        if job.exited.is_set():
            return JobStatus.UNKNOWN if job.lost else JobStatus.EXITED
        return JobStatus.RUNNING if job.started else JobStatus.PENDING

    def logs(self, job: ContainerJob) -> str:
        text = bytes(job.tail).decode("utf-8", "replace")
        if not text and not job.exited.is_set():
            return f"(container {job.name} has printed nothing yet)"
        return text

    def start(self, request: CreateRequest, echo: bool) -> ContainerJob:
        """Create, attach to and start one container; return once it runs."""
        docker = self._docker
        labels = {**request.labels, ENGINE_LABEL: self.engine_id}
        host_config = self.api.create_host_config(**request.host_config)
        try:
            created = self.api.create_container(
                request.image, command=request.command, name=request.name,
                environment=request.environment, labels=labels, working_dir=request.working_dir,
                user=request.user, host_config=host_config, detach=True,
            )
        except docker.errors.ImageNotFound:
            raise DockerImageNotFound(
                f"the image {request.image!r} does not exist on this Docker host (fiber-docker never "
                f"pulls). Build it: `python -m fiber_docker.image --tag {request.image}` (add "
                "`-r requirements.txt` for your code's dependencies), or `docker pull` it, or set "
                "image=... (FIBER_IMAGE) to an image you have (`docker images`)."
            ) from None
        except docker.errors.APIError as exc:
            raise RuntimeError(f"Docker refused to create {request.name}: {exc.explanation or exc}") from None
        except Exception as exc:
            raise explain_unreachable(exc) from exc
        job = ContainerJob(created["Id"], request.name)
        with self._lock:
            self.jobs[job.cid] = job
        try:
            stream = self.api.attach(job.cid, stdout=True, stderr=True, stream=True, logs=True, demux=True)
            threading.Thread(target=self._pump, args=(job, stream, echo),
                             name=f"fiber-docker-out-{job.name}", daemon=True).start()
            self.api.start(job.cid)
        except docker.errors.APIError as exc:
            self._remove_quietly(job.cid)
            self._finish(job, LOST_EXIT)
            raise RuntimeError(
                f"Docker could not start {request.name} ({request.image}): {exc.explanation or exc}"
            ) from None
        job.started = True
        return job

    def pid_of(self, job: ContainerJob) -> int | None:
        """The host pid of the container's init process (unique on this host)."""
        try:
            return int(self.api.inspect_container(job.cid)["State"]["Pid"]) or None
        except Exception:
            return None

    def wait(self, job: ContainerJob, timeout: float | None) -> int | None:
        if not job.exited.wait(timeout):
            return None
        job.output_done.wait(2.0)  # the last lines, for the logs of a failed job
        return job.exitcode

    def terminate(self, job: ContainerJob, force: bool) -> None:
        """SIGTERM (through the container's init) or SIGKILL; gone or stopped is fine."""
        if job.exited.is_set():
            return
        try:
            self.api.kill(job.cid, signal="SIGKILL" if force else "SIGTERM")
        except self._docker.errors.NotFound:
            pass
        except self._docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: not running (already stopped)
                raise

    def _remove_quietly(self, cid: str) -> None:
        try:
            self.api.remove_container(cid, force=True)
        except Exception:
            pass

    def cleanup(self, session: str | None) -> int:
        """Remove every container of ``session``; None: of every session whose master is gone
        (:func:`fibercore.backendkit.sessions_to_clean`)."""
        if session is not None:
            return self._cleanup_session(session)
        found = self.api.containers(all=True, filters={"label": "fiber-session"})
        jobs = [((c.get("Labels") or {}).get("fiber-session", ""), c.get("Labels") or {},
                 c.get("State") in ("created", "running", "restarting", "paused")) for c in found]
        return sum(self._cleanup_session(s) for s in sessions_to_clean(jobs))

    def _cleanup_session(self, session: str) -> int:
        """Remove every container of ``session``, its master first."""
        def find() -> list[tuple[str, bool]]:
            found = self.api.containers(all=True, filters={"label": f"fiber-session={session}"})
            return [(c["Id"], (c.get("Labels") or {}).get("fiber-process") == "master") for c in found]

        def remove(ids: list[str]) -> None:
            for cid in ids:
                self._remove_quietly(cid)

        return clean_session(find, remove)

    # -- operations (the fiber command, from any process) ------------------------------
    def list_jobs(self, session: str | None) -> list[JobInfo]:
        """The containers of ``session`` (any fiber session when None) as JobInfo records."""
        from fibercore.types import JobInfo, JobStatus

        label = f"fiber-session={session}" if session else "fiber-session"
        out = []
        for info in self.api.containers(all=True, filters={"label": label}):
            state = info.get("State", "")
            status = {"created": JobStatus.PENDING, "running": JobStatus.RUNNING, "restarting": JobStatus.RUNNING,
                      "paused": JobStatus.RUNNING, "exited": JobStatus.EXITED,
                      "dead": JobStatus.EXITED}.get(state, JobStatus.UNKNOWN)
            labels = info.get("Labels") or {}
            code = None
            if status is JobStatus.EXITED:
                code = self.api.inspect_container(info["Id"])["State"].get("ExitCode")
            out.append(JobInfo(jid=info["Id"][:12], backend="docker", session=labels.get("fiber-session", "?"),
                               name=labels.get("fiber-process", "?"), status=status, image=info.get("Image"),
                               created=info.get("Created"), exitcode=code))
        return out

    def fiber_container(self, jid: str) -> dict[str, Any] | None:
        """The inspect data of container ``jid`` if it is a fiber job, else None."""
        try:
            data = self.api.inspect_container(jid)
        except self._docker.errors.NotFound:
            return None
        return data if "fiber-session" in (data["Config"].get("Labels") or {}) else None

    def read_logs(self, jid: str) -> str | None:
        if self.fiber_container(jid) is None:
            return None
        return str(self.api.logs(jid, stdout=True, stderr=True).decode("utf-8", "replace"))

    def copy(self, jid: str, source: str, destination: str, into_job: bool) -> bool | None:
        """docker cp: a path in the container is relative to its working directory; None when
        ``jid`` is no fiber container."""
        import io
        import tarfile

        data = self.fiber_container(jid)
        if data is None:
            return None
        workdir = data["Config"].get("WorkingDir") or "/"
        jid = data["Id"]

        def inside(path: str) -> str:
            return path if path.startswith("/") else os.path.join(workdir or "/", path)

        if into_job:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                tar.add(source, arcname=os.path.basename(source.rstrip("/")))
            target = inside(destination)
            if not self.api.put_archive(jid, target, buf.getvalue()):
                raise RuntimeError(f"docker refused to copy {source} into {jid}:{target} (is it a directory there?)")
            return True
        try:
            stream, _ = self.api.get_archive(jid, inside(source))
        except self._docker.errors.NotFound:
            raise FileNotFoundError(f"no {inside(source)} in container {jid}") from None
        buf = io.BytesIO(b"".join(stream))
        with tarfile.open(fileobj=buf) as tar:
            members = tar.getmembers()
            if os.path.isdir(destination):
                tar.extractall(destination, filter="data")
            elif len(members) == 1 and members[0].isfile():
                extracted = tar.extractfile(members[0])
                assert extracted is not None
                with open(destination, "wb") as fh:
                    fh.write(extracted.read())
            else:
                os.makedirs(destination, exist_ok=True)
                tar.extractall(destination, filter="data")
        return True

    def close(self) -> None:
        """At exit: kill what still runs (the core has joined or stopped its jobs by now)."""
        self._closing = True
        for job in list(self.jobs.values()):
            if job.started and not job.exited.is_set():
                try:
                    self.terminate(job, True)
                except Exception:
                    pass
        self._secrets.close()

    def doctor(self, config: ConfigView) -> list[Check]:
        """The daemon's version, and whether the image is there."""
        from fiber_docker import DEFAULT_IMAGE
        from fibercore.types import Check

        version = self.client.version()
        checks = [Check(NAME, "Docker daemon reachable", True,
                        f"Docker {version.get('Version')}, API {version.get('ApiVersion')}")]
        image = config.get("image") or config.get("default_image") or DEFAULT_IMAGE
        try:
            self.client.images.get(image)
            checks.append(Check(NAME, f"image {image} present", True))
        except Exception:
            checks.append(Check(NAME, f"image {image} present", False, "not on this daemon",
                                "build it: python -m fiber_docker.image (or fiber run --build), or docker pull it"))
        return checks


def docker_socket(config: ConfigView) -> str | None:
    """The daemon's unix socket path, to mount into jobs so that they can start jobs."""
    host = config.get("docker_host") or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if host.startswith("unix://"):
        return str(host[len("unix://"):])
    return None
