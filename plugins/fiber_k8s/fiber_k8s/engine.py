"""The Kubernetes backend's moving parts: the API client, one pod watch, the secret.

- **Status and exit codes** come from one watch on this master's pods (selected by a
  label unique to this engine), started from a listing's resourceVersion before the
  first pod is created and re-listed when the server expires it (410): no GET per pod.
- **Finished pods**: their logs are read once (kept for error messages), then the pod
  is deleted (``k8s_delete_finished``), so nothing accumulates in the namespace.
- **Pods that can never start** (an image that cannot be pulled, a bad config) end as
  failed at once with the reason in their logs, instead of waiting for start_timeout.
- **The session secret** is a Kubernetes Secret ``fiber-<session>`` (labelled, owned by
  the master's pod when there is one) referenced by every pod's env; deleted at exit.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from fibercore.backendkit import clean_session, outward_address, sessions_to_clean, signal_exit_code
from fibercore.errors import BackendUnavailableError, ConfigError

if TYPE_CHECKING:
    from fibercore.types import Check, ConfigView, Job, JobInfo, JobSpec, JobStatus

NAME = "kubernetes"

log = logging.getLogger("fiber_k8s")

ENGINE_LABEL = "fibercore/engine"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TAIL_LINES = 2000
API_LOST_AFTER = 60.0  # seconds without the API before running pods count as lost
#: Waiting reasons after which a pod will not start by itself.
HOPELESS = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName",
                      "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})


class KubernetesUnavailable(RuntimeError, BackendUnavailableError):
    """The cluster's API cannot be reached or used as configured."""


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and os.path.exists(os.path.join(SA_DIR, "token"))


class OwnerGone(RuntimeError):
    """The pod of the process that would own a new job is deleted or being deleted."""


class PodJob:
    """What the engine knows about one pod it created."""

    def __init__(self, name: str, engine: Any = None) -> None:
        self.name = name
        self.engine = engine  # the Engine (cluster, namespace) that created it
        self.phase = "Pending"
        self.exit_status: int | None = None
        self.reason: str | None = None
        self.note: str = ""  # why it is pending, or why it failed without running
        self.deleted = False
        self.terminated_by: bool | None = None  # None: not by us; False: terminate(); True: kill()
        self.exitcode: int | None = None
        self.logs: str | None = None
        self.done = threading.Event()


def _exitcode(job: PodJob) -> int:
    if job.exit_status is not None:
        return signal_exit_code(job.exit_status)
    if job.terminated_by is not None:
        return -9 if job.terminated_by else -15
    if job.deleted:
        return -9  # deleted from outside before its container reported: it was killed
    return 0 if job.phase == "Succeeded" else 1


class Engine:
    def __init__(self, cfg: Any) -> None:
        try:
            from kubernetes import client, config
        except ImportError as exc:  # pragma: no cover - fiber-k8s depends on it
            raise KubernetesUnavailable("the kubernetes client is not installed: reinstall fiber-k8s "
                                        "(it depends on it) or pip install kubernetes") from exc
        self.cfg = cfg
        kubeconfig = cfg.get("k8s_kubeconfig") or None
        context = cfg.get("k8s_context") or None
        namespace = cfg.get("k8s_namespace") or None
        try:
            if kubeconfig or context or not in_cluster():
                api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
                if namespace is None:
                    contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
                    chosen = next((c for c in contexts if c["name"] == context), active) if context else active
                    namespace = (chosen.get("context") or {}).get("namespace")
            else:
                config.load_incluster_config()
                api_client = client.ApiClient()
                if namespace is None:
                    with open(os.path.join(SA_DIR, "namespace")) as fh:
                        namespace = fh.read().strip()
        except Exception as exc:
            raise KubernetesUnavailable(
                f"cannot load the Kubernetes configuration ({type(exc).__name__}: {exc}); set k8s_kubeconfig / "
                "k8s_context (or KUBECONFIG), or run in a pod with a service account"
            ) from exc
        self.client = client
        self.core = client.CoreV1Api(api_client)
        self.namespace = namespace or "default"
        self.engine_id = secrets.token_hex(6)
        self.selector = f"{ENGINE_LABEL}={self.engine_id}"
        self.pods: dict[str, PodJob] = {}
        self.owned_secrets: set[str] = set()
        self.known_secrets: set[str] = set()
        self._lock = threading.Lock()
        self._closing = False
        self._after = ThreadPoolExecutor(max_workers=4, thread_name_prefix="fiber-k8s-finish")
        try:
            listed = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        except Exception as exc:
            raise self.explain(exc, f"listing pods in namespace {self.namespace}") from exc
        self._rv = listed.metadata.resource_version
        threading.Thread(target=self._watch, name="fiber-k8s-watch", daemon=True).start()

    def explain(self, exc: BaseException, doing: str) -> BaseException:
        status = getattr(exc, "status", None)
        if status in (401, 403):
            return KubernetesUnavailable(
                f"{doing}: the API refused ({status} {getattr(exc, 'reason', '')}); the service account or user "
                f"needs the Role in fiber-k8s's rbac.yaml (pods, pods/log, secrets) in namespace {self.namespace}"
            )
        if status == 404 and "namespace" in str(getattr(exc, "body", "")):
            return KubernetesUnavailable(f"{doing}: namespace {self.namespace} does not exist; set k8s_namespace")
        if status is None and not isinstance(exc, KubernetesUnavailable):
            return KubernetesUnavailable(f"{doing}: cannot reach the Kubernetes API ({type(exc).__name__}: {exc})")
        return exc

    # -- the watch --------------------------------------------------------------------
    def _watch(self) -> None:
        from kubernetes import watch

        failing_since: float | None = None
        while not self._closing:
            try:
                stream = watch.Watch().stream(
                    self.core.list_namespaced_pod, self.namespace, label_selector=self.selector,
                    resource_version=self._rv, timeout_seconds=120, allow_watch_bookmarks=True,
                )
                for event in stream:
                    failing_since = None
                    pod = event["object"]
                    if getattr(pod, "metadata", None) is not None and pod.metadata.resource_version:
                        self._rv = pod.metadata.resource_version
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        self._on_pod(pod, deleted=event["type"] == "DELETED")
            except Exception as exc:
                if getattr(exc, "status", None) == 410:  # expired: list again, then watch from there
                    self._relist()
                    continue
                now = time.monotonic()
                failing_since = failing_since or now
                if now - failing_since > API_LOST_AFTER:
                    self._lose_all(exc)
                time.sleep(0.5)

    def _lose_all(self, exc: BaseException) -> None:
        """The API has been unreachable for API_LOST_AFTER s: nothing will report these
        pods' ends, so end them here (rather than let join() wait forever)."""
        lost = [job for job in self.pods.values() if not job.done.is_set()]
        if lost:
            log.warning("fiber-k8s: the Kubernetes API is unreachable (%s) for %.0f s; treating %d pod(s) as lost",
                        exc, API_LOST_AFTER, len(lost))
        for job in lost:
            job.deleted = True
            job.note += f"\n[fiber-k8s] lost: the Kubernetes API was unreachable ({exc})"
            job.exitcode = _exitcode(job)
            job.done.set()

    def _relist(self) -> None:
        try:
            listed = self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        except Exception:
            time.sleep(1.0)
            return
        self._rv = listed.metadata.resource_version
        present = set()
        for pod in listed.items:
            present.add(pod.metadata.name)
            self._on_pod(pod, deleted=False)
        for job in list(self.pods.values()):
            if job.name not in present and not job.done.is_set():
                job.deleted = True
                self._finish(job)

    def _on_pod(self, pod: Any, deleted: bool) -> None:
        job = self.pods.get(pod.metadata.name)
        if job is None or job.done.is_set():
            return
        status = pod.status
        job.phase = (status.phase if status else None) or job.phase
        for cs in (status.container_statuses or []) if status else []:
            if cs.state and cs.state.terminated:
                job.exit_status = cs.state.terminated.exit_code
                job.reason = cs.state.terminated.reason
            elif cs.state and cs.state.waiting and cs.state.waiting.reason in HOPELESS:
                job.note = (f"[fiber-k8s] pod {job.name} cannot start: {cs.state.waiting.reason}: "
                            f"{cs.state.waiting.message or ''}")
                job.exit_status = job.exit_status if job.exit_status is not None else 1
                self._finish(job)
                return
        for cond in (status.conditions or []) if status else []:
            if cond.type == "PodScheduled" and cond.status == "False":
                job.note = f"[fiber-k8s] pod {job.name} is not scheduled: {cond.reason}: {cond.message or ''}"
        if deleted:
            job.deleted = True
            self._finish(job)
        elif job.phase in ("Succeeded", "Failed"):
            self._finish(job)

    def _finish(self, job: PodJob) -> None:
        with self._lock:
            if job.done.is_set() or getattr(job, "_finishing", False):
                return
            job._finishing = True  # type: ignore[attr-defined]
        try:
            self._after.submit(self._settle, job)
        except RuntimeError:  # shutting down
            self._settle(job, keep=True)

    def _settle(self, job: PodJob, keep: bool = False) -> None:
        """Keep the pod's output, delete the pod, then report its end."""
        if not job.deleted:
            job.logs = self.pod_log(job)
            if self.cfg.get("k8s_delete_finished", True) and not keep:
                self._delete(job.name, 0)
        if job.reason == "OOMKilled":
            job.note += "\n[fiber-k8s] the container was OOMKilled: it used more than its memory limit"
        job.exitcode = _exitcode(job)
        job.done.set()

    # -- calls ------------------------------------------------------------------------
    def ensure_secret(self, session: str, secret_hex: str, labels: dict[str, str], owner: Any) -> str:
        from fiber_k8s.manifest import secret_manifest, secret_name

        name = secret_name(session)
        with self._lock:
            if name in self.known_secrets:
                return name
            body = secret_manifest(name, self.namespace, secret_hex, labels, owner)
            try:
                self.core.create_namespaced_secret(self.namespace, body)
                self.owned_secrets.add(name)  # ours to delete at exit
            except Exception as exc:
                if getattr(exc, "status", None) != 409:  # 409: the session's master made it: not ours
                    raise self.explain(exc, f"creating Secret {name}") from exc
            self.known_secrets.add(name)
            return name

    def create(self, spec: JobSpec, config: ConfigView) -> Job:
        """A pod for ``spec`` (owned by the master's pod when there is one), the session secret
        from a Secret; returns at once (status comes from the watch)."""
        from fiber_k8s.manifest import label_value, pod_manifest, pod_name
        from fibercore.types import Job

        self.cfg = config  # the settings that are not the engine's key follow the current config
        owner = self.owner_reference(own_pod_name(config))
        session_labels = {"fiber-session": label_value(spec.session), "app.kubernetes.io/managed-by": "fibercore"}
        secret_hex = spec.secret_env.get("FIBER_SECRET")
        secret = self.ensure_secret(spec.session, secret_hex, session_labels, owner) if secret_hex else None
        name = pod_name(spec.session, spec.name, secrets.token_hex(3))
        manifest = pod_manifest(spec, config, name=name, namespace=self.namespace,
                                labels={**session_labels, "fiber-backend": NAME}, owner=owner, secret=secret)
        manifest["spec"]["containers"][0]["env"].append(
            {"name": "FIBERCORE_K8S_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        job = self.start(manifest)
        return Job(jid=name, backend=NAME, data=job, host=None, pid=None, spec=spec,
                   command=manifest["spec"]["containers"][0]["command"])

    def status(self, job: PodJob) -> JobStatus:
        from fibercore.types import JobStatus

        if job.done.is_set():
            return JobStatus.EXITED
        return JobStatus.RUNNING if job.phase == "Running" else JobStatus.PENDING

    def wait(self, job: PodJob, timeout: float | None) -> int | None:
        if not job.done.wait(timeout):
            return None
        return job.exitcode

    def start(self, manifest: dict[str, Any]) -> PodJob:
        """Create the pod of ``manifest``; the watch reports what becomes of it."""
        name = manifest["metadata"]["name"]
        manifest["metadata"]["labels"][ENGINE_LABEL] = self.engine_id
        job = PodJob(name, self)
        with self._lock:
            self.pods[name] = job
        try:
            self.core.create_namespaced_pod(self.namespace, manifest)
        except Exception as exc:
            with self._lock:
                self.pods.pop(name, None)
            body = getattr(exc, "body", None)
            if getattr(exc, "status", None) in (400, 422):
                raise ValueError(f"the Kubernetes API rejected pod {name}: {body}") from None
            raise self.explain(exc, f"creating pod {name}") from exc
        return job

    def _delete(self, name: str, grace: int) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=grace)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:  # already gone
                raise self.explain(exc, f"deleting pod {name}") from exc

    def terminate(self, job: PodJob, force: bool) -> None:
        if job.done.is_set():
            return
        if job.terminated_by is None or force:
            job.terminated_by = force
        self._delete(job.name, 0 if force else int(self.cfg.get("k8s_grace_period") or 0))

    def pod_log(self, job: PodJob) -> str:
        """The last lines the pod's worker container printed ("" when there are none yet)."""
        try:
            text = self.core.read_namespaced_pod_log(job.name, self.namespace, container="worker",
                                                     tail_lines=TAIL_LINES)
        except Exception as exc:
            status = getattr(exc, "status", None)
            if status in (400, 404):
                return ""
            return f"(could not read the logs of pod {job.name}: {exc})"
        return str(text or "")

    def logs(self, job: PodJob) -> str:
        text = job.logs if job.logs is not None else self.pod_log(job)
        text = (text + ("\n" + job.note if job.note else "")).strip("\n")
        if not text:
            return f"(pod {job.name} has printed nothing yet; phase {job.phase})"
        return text

    def owner_reference(self, pod_name: str | None) -> dict[str, Any] | None:
        """ownerReference to ``pod_name`` (the master's pod), so deleting it deletes the jobs."""
        if not pod_name:
            return None
        try:
            pod = self.core.read_namespaced_pod(pod_name, self.namespace)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:  # this process's pod was deleted: it is being stopped
                raise OwnerGone(f"the pod {pod_name} this process runs in was deleted: no job is started that "
                                "would outlive it") from None
            log.warning("fiber-k8s: no owner for the jobs: cannot read pod %s (%s)", pod_name, exc)
            return None
        if pod.metadata.deletion_timestamp is not None:
            raise OwnerGone(f"the pod {pod_name} this process runs in is being deleted: no job is started "
                            "that would outlive it")
        return {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod.metadata.uid}

    def cleanup(self, session: str | None) -> int:
        """Delete the pods (and Secret) of ``session``; None: of every session whose master is
        gone (:func:`fibercore.backendkit.sessions_to_clean`)."""
        if session is not None:
            return self._cleanup_session(session)
        pods = self.core.list_namespaced_pod(self.namespace, label_selector="fiber-session").items
        jobs = [((p.metadata.labels or {}).get("fiber-session", ""), p.metadata.labels or {},
                 p.status.phase in ("Pending", "Running", "Unknown")) for p in pods]
        return sum(self._cleanup_session(s) for s in sessions_to_clean(jobs) if s)

    def _cleanup_session(self, session: str) -> int:
        selector = f"fiber-session={session}"

        def find() -> list[tuple[str, bool]]:
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
            return [(p.metadata.name, (p.metadata.labels or {}).get("fiber-process") == "master") for p in pods]

        def remove(names: list[str]) -> None:
            for name in names:
                self._delete(name, 0)

        count = clean_session(find, remove, passes=1)
        for name in self._session_secrets(session, selector):
            try:
                self.core.delete_namespaced_secret(name, self.namespace)
            except Exception:
                pass
            self.owned_secrets.discard(name)
            self.known_secrets.discard(name)
        # Also forget a session Secret the listing no longer showed (deleted by the garbage
        # collector with its owner pod): a later job of the session must create it again.
        from fiber_k8s.manifest import secret_name

        with self._lock:
            gone = {n for n in self.known_secrets if n == secret_name(session)}
            self.known_secrets -= gone
            self.owned_secrets -= gone
        return count

    def _session_secrets(self, session: str | None, selector: str) -> list[str]:
        """Names of the Secrets to delete: listed when this identity may list Secrets, else
        the session's own by name (the job Role has no "list")."""
        from fiber_k8s.manifest import secret_name

        try:
            return [s.metadata.name for s in
                    self.core.list_namespaced_secret(self.namespace, label_selector=selector).items]
        except Exception as exc:
            if getattr(exc, "status", None) != 403:
                raise
        return [secret_name(session)] if session else []

    # -- operations (the fiber command, from any process) ------------------------------
    def list_jobs(self, session: str | None) -> list[JobInfo]:
        """The pods of ``session`` (any fiber session when None) as JobInfo records."""
        from fibercore.types import JobInfo, JobStatus

        selector = f"fiber-session={session}" if session else "fiber-session"
        try:
            pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        except Exception as exc:
            raise self.explain(exc, f"listing pods in namespace {self.namespace}") from exc
        out = []
        for pod in pods:
            phase = (pod.status.phase if pod.status else None) or "Pending"
            status = {"Pending": JobStatus.PENDING, "Running": JobStatus.RUNNING,
                      "Succeeded": JobStatus.EXITED, "Failed": JobStatus.EXITED}.get(phase, JobStatus.UNKNOWN)
            code = None
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                if cs.state and cs.state.terminated:
                    code = cs.state.terminated.exit_code
            created = pod.metadata.creation_timestamp
            out.append(JobInfo(
                jid=pod.metadata.name, backend="kubernetes", session=pod.metadata.labels.get("fiber-session", "?"),
                name=(pod.metadata.annotations or {}).get("fibercore/process", "?"), status=status,
                host=pod.spec.node_name, image=pod.spec.containers[0].image if pod.spec.containers else None,
                created=created.timestamp() if created else None, exitcode=code))
        return out

    def read_logs(self, jid: str) -> str | None:
        """The output of fiber pod ``jid``, from any process (None: no such pod)."""
        if not self.is_fiber_pod(jid):
            return None
        return self.pod_log(PodJob(jid, self)) or f"(pod {jid} has printed nothing yet)"

    def copy(self, jid: str, source: str, destination: str, into_job: bool) -> bool | None:
        if not self.is_fiber_pod(jid):
            return None
        raise ConfigError(
            "fiber cp into or out of a pod is not implemented by fiber-k8s (it needs exec and tar in the "
            f"image): use `kubectl cp {jid}:PATH DEST`, or a volume (k8s_volumes) the pods write to"
        )

    def is_fiber_pod(self, name: str) -> bool:
        try:
            pod = self.core.read_namespaced_pod(name, self.namespace)
        except Exception as exc:
            if getattr(exc, "status", None) == 404:
                return False
            raise self.explain(exc, f"reading pod {name}") from exc
        return "fiber-session" in (pod.metadata.labels or {})

    def follow(self, job: PodJob) -> Iterator[str]:
        """The pod's output as it is printed: waits for its container to start, then follows."""
        while job.phase == "Pending" and not job.done.is_set():
            job.done.wait(0.25)
        if job.done.is_set() and job.logs is not None:  # finished (and maybe deleted) already
            yield job.logs
            return
        try:
            resp = self.core.read_namespaced_pod_log(job.name, self.namespace, container="worker", follow=True,
                                                     _preload_content=False)
        except Exception as exc:
            job.done.wait(5)
            if job.logs is not None:
                yield job.logs
                return
            raise self.explain(exc, f"following the output of pod {job.name}") from exc
        try:
            for chunk in resp.stream(amt=4096, decode_content=True):
                yield chunk.decode("utf-8", "replace") if isinstance(chunk, bytes) else str(chunk)
        finally:
            resp.release_conn()

    def close(self) -> None:
        """At exit: delete what still runs and the secrets this process created."""
        self._closing = True
        for job in list(self.pods.values()):
            if not job.done.is_set():
                try:
                    self._delete(job.name, 0)
                except Exception:
                    pass
        for name in list(self.owned_secrets):
            try:
                self.core.delete_namespaced_secret(name, self.namespace)
            except Exception:
                pass
        self.owned_secrets.clear()

    def doctor(self, config: ConfigView) -> list[Check]:
        """May this identity list pods and read the session's Secret; is an image set."""
        from fibercore.types import Check

        checks = [Check(NAME, "Kubernetes API reachable", True, f"namespace {self.namespace}")]
        for verb, call in (("list pods", lambda: self.core.list_namespaced_pod(self.namespace, limit=1)),
                           ("read the session's secret", self._probe_secret)):
            try:
                call()
                checks.append(Check(NAME, f"may {verb}", True))
            except Exception as exc:
                checks.append(Check(NAME, f"may {verb}", False, str(getattr(exc, "reason", exc)),
                                    "apply rbac.yaml (Role pods, pods/log, secrets) to this user or service account"))
        image = config.get("image") or config.get("default_image")
        checks.append(Check(NAME, "worker image set", bool(image), image or "no image",
                            "set image=REGISTRY/NAME:TAG (FIBER_IMAGE), or use `fiber run --build --push REGISTRY`"))
        return checks

    def _probe_secret(self) -> None:
        """A get of a Secret by name (the Role has no "list"): 404 means allowed."""
        try:
            self.core.read_namespaced_secret("fibercore-doctor-probe", self.namespace)
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise


def own_pod_name(config: ConfigView) -> str | None:
    """The pod this process runs in, if any (the owner of the pods it creates)."""
    return (config.get("k8s_owner_pod") or os.environ.get("FIBERCORE_K8S_POD_NAME")
            or (os.environ.get("HOSTNAME") if in_cluster() else None))


def listen_host(config: ConfigView) -> str:
    """The address pods reach this process at: its pod IP in the cluster, else the address
    that routes outward (a master outside the cluster; see the README)."""
    if os.environ.get("FIBERCORE_K8S_POD_IP") or os.environ.get("FIBERCORE_K8S_POD_NAME"):  # a pod fibercore started
        return str(config.get("k8s_job_listen_host") or os.environ.get("FIBERCORE_K8S_POD_IP")
                   or socket.gethostbyname(socket.gethostname()))
    if in_cluster():  # a master in a pod: its pod IP
        return socket.gethostbyname(socket.gethostname())
    return outward_address()
