"""Kubernetes backend: every Fiber process is a pod (``FIBER_BACKEND=kubernetes`` or ``k8s``;
chosen automatically inside a pod).

Pods run ``python -m fibercore.worker`` with the image's python, restartPolicy Never,
requests = limits from ``cpu``/``memory``/``gpu`` (``nvidia.com/gpu``), the session
secret from a Secret, labels with the session and process, and an ownerReference to
the master's pod when the master runs in the cluster. Status comes from one watch.
The kubernetes client is imported on first use. See the README and ``rbac.yaml``.
"""

from __future__ import annotations

import atexit
import os
import secrets
import socket
import threading
from typing import Any

import pluggy

hookimpl = pluggy.HookimplMarker("fiber")

#: The fibercore hook contract these hooks are written for (fibercore.hookspecs).
FIBER_CONTRACT = 2
NAME = "kubernetes"

_engine: Any = None
_engine_key: tuple[Any, ...] | None = None
_engine_lock = threading.Lock()
_retired: list[Any] = []  # engines of an earlier configuration (init() switched clusters)


def engine(cfg: Any) -> Any:
    """This process's Engine for the configured cluster and namespace (``cfg``)."""
    global _engine, _engine_key
    key = (cfg.get("k8s_kubeconfig"), cfg.get("k8s_context"), cfg.get("k8s_namespace"))
    with _engine_lock:
        if _engine is None or _engine_key != key:
            from fiber_k8s.engine import Engine

            if _engine is not None:  # its pods keep their engine (PodJob.engine) until they end
                _retired.append(_engine)
            _engine, _engine_key = Engine(cfg), key
        _engine.cfg = cfg
    return _engine


@atexit.register  # registered at import, so it runs after fibercore joined its jobs
def _at_exit() -> None:
    for eng in [*_retired, _engine]:
        if eng is not None:
            eng.close()


def _pod(job: Any) -> Any:
    if getattr(job, "backend", None) not in (NAME, "k8s"):
        return None
    return job.data


def _own_pod_name(cfg: Any) -> str | None:
    """The pod this process runs in, if any (the owner of the pods it creates)."""
    from fiber_k8s.engine import in_cluster

    return (cfg.get("k8s_owner_pod") or os.environ.get("FIBERCORE_K8S_POD_NAME")
            or (os.environ.get("HOSTNAME") if in_cluster() else None))


@hookimpl
def fiber_config_options() -> list[Any]:
    from fibercore.types import Option

    def opt(name: str, typ: Any, default: Any, text: str) -> Any:
        return Option(name, typ, default, text, plugin="fiber-k8s")

    return [
        opt("k8s_kubeconfig", str, None, "kubeconfig file (default: KUBECONFIG or ~/.kube/config; in a pod: its "
                                         "service account)."),
        opt("k8s_context", str, None, "kubeconfig context (default: the current one)."),
        opt("k8s_namespace", str, None, "Namespace of the pods (default: the context's, or the pod's own)."),
        opt("k8s_service_account", str, None, "Service account of the pods (jobs that start jobs need the rbac.yaml "
                                              "Role)."),
        opt("k8s_image_pull_secrets", str, None, "imagePullSecrets of the pods: NAME,..."),
        opt("k8s_image_pull_policy", str, "IfNotPresent", "imagePullPolicy of the worker container."),
        opt("k8s_node_selector", str, None, "nodeSelector: KEY=VALUE,..."),
        opt("k8s_tolerations", str, None, "tolerations as a JSON list (or @file.json / @file.yaml)."),
        opt("k8s_volumes", str, None, "volumes: KIND:SOURCE:MOUNT_PATH[:ro],... with KIND pvc, emptydir or hostpath."),
        opt("k8s_labels", str, None, "extra pod labels: KEY=VALUE,..."),
        opt("k8s_workdir", str, None, "workingDir of the worker container."),
        opt("k8s_host_network", bool, False, "Run the pods on the node's network (hostNetwork)."),
        opt("k8s_grace_period", int, 0, "terminationGracePeriodSeconds, and the grace terminate() gives."),
        opt("k8s_delete_finished", bool, True, "Delete each pod once it has finished (its output is kept by the "
                                               "master)."),
        opt("k8s_pod_patch", str, None,
            "Escape hatch: a JSON merge patch (or @file.json / @file.yaml) applied to every pod manifest; "
            "lists of named objects (containers, env, volumes) merge by name."),
        opt("k8s_owner_pod", str, None, "Pod that owns the jobs (default: this process's pod in the cluster)."),
        opt("k8s_job_listen_host", str, None, "Address a pod advertises for the processes it starts (default: its pod "
                                              "IP)."),
    ]


@hookimpl
def fiber_config_defaults() -> dict[str, Any]:
    """Creating a pod is one API call and the cluster schedules them in parallel: a Pool
    creates all its pods at once. Image pulls can be slow: starting waits 5 minutes."""
    return {"pool_start_concurrency": 0, "start_timeout": 300.0}


@hookimpl
def fiber_detect_backend() -> str | None:
    from fiber_k8s.engine import in_cluster

    return NAME if in_cluster() else None


@hookimpl
def fiber_listen_host(config: Any) -> str:
    cfg = config
    if os.environ.get("FIBERCORE_K8S_POD_IP") or os.environ.get("FIBERCORE_K8S_POD_NAME"):  # a pod fibercore started
        return (cfg.get("k8s_job_listen_host") or os.environ.get("FIBERCORE_K8S_POD_IP")
                or socket.gethostbyname(socket.gethostname()))
    from fiber_k8s.engine import in_cluster

    if in_cluster():  # a master in a pod: its pod IP
        return socket.gethostbyname(socket.gethostname())
    # A master outside the cluster: pods must be able to reach it (see the README).
    from fibercore.backendkit import outward_address

    return outward_address()


@hookimpl
def fiber_create_job(spec: Any, config: Any) -> Any:
    from fiber_k8s.manifest import label_value, pod_manifest, pod_name
    from fibercore.types import Job

    eng = engine(config)
    owner = eng.owner_reference(_own_pod_name(config))
    session_labels = {"fiber-session": label_value(spec.session), "app.kubernetes.io/managed-by": "fibercore"}
    secret_hex = spec.secret_env.get("FIBER_SECRET")
    secret = eng.ensure_secret(spec.session, secret_hex, session_labels, owner) if secret_hex else None
    name = pod_name(spec.session, spec.name, secrets.token_hex(3))
    manifest = pod_manifest(spec, config, name=name, namespace=eng.namespace,
                            labels={**session_labels, "fiber-backend": NAME}, owner=owner, secret=secret)
    manifest["spec"]["containers"][0]["env"].append(
        {"name": "FIBERCORE_K8S_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    job = eng.create(manifest)
    return Job(jid=name, backend=NAME, data=job, host=None, pid=None, spec=spec,
               command=manifest["spec"]["containers"][0]["command"])


@hookimpl
def fiber_job_status(job: Any) -> Any:
    from fibercore.types import JobStatus

    p = _pod(job)
    if p is None:
        return None
    if p.done.is_set():
        return JobStatus.EXITED
    return JobStatus.RUNNING if p.phase == "Running" else JobStatus.PENDING


@hookimpl
def fiber_wait_job(job: Any, timeout: float | None) -> int | None:
    p = _pod(job)
    if p is None:
        return None
    if not p.done.wait(timeout):
        return None
    return p.exitcode


@hookimpl
def fiber_terminate_job(job: Any, force: bool) -> bool | None:
    p = _pod(job)
    if p is None:
        return None
    p.engine.terminate(p, force)
    return True


@hookimpl
def fiber_job_logs(job: Any) -> str | None:
    p = _pod(job)
    if p is None:
        return None
    return p.engine.logs(p)


@hookimpl
def fiber_cleanup_jobs(session: str | None, config: Any) -> int:
    return engine(config).cleanup(session)


@hookimpl
def fiber_list_jobs(session: str | None, config: Any) -> list[Any]:
    return engine(config).list_jobs(session)


@hookimpl
def fiber_read_job_logs(jid: str, config: Any) -> str | None:
    eng = engine(config)
    if not eng.is_fiber_pod(jid):
        return None
    from fiber_k8s.engine import PodJob

    return eng.read_logs(PodJob(jid, eng)) or f"(pod {jid} has printed nothing yet)"


@hookimpl
def fiber_follow_logs(job: Any, config: Any) -> Any:
    p = _pod(job)
    if p is None:
        return None
    return p.engine.follow(p)


@hookimpl
def fiber_copy_files(jid: str, config: Any) -> bool | None:
    if not engine(config).is_fiber_pod(jid):
        return None
    from fibercore.errors import ConfigError

    raise ConfigError(
        "fiber cp into or out of a pod is not implemented by fiber-k8s (it needs exec and tar in the "
        f"image): use `kubectl cp {jid}:PATH DEST`, or a volume (k8s_volumes) the pods write to"
    )


def _probe_secret(eng: Any) -> None:
    """A get of a Secret by name (the Role has no "list"): 404 means allowed."""
    try:
        eng.core.read_namespaced_secret("fibercore-doctor-probe", eng.namespace)
    except Exception as exc:
        if getattr(exc, "status", None) != 404:
            raise


@hookimpl
def fiber_doctor(config: Any) -> list[Any]:
    from fibercore.types import Check

    checks = []
    try:
        eng = engine(config)
    except Exception as exc:
        return [Check(NAME, "Kubernetes API reachable", False, f"{type(exc).__name__}: {exc}",
                      "set k8s_kubeconfig / k8s_context (or KUBECONFIG), or run in a pod with a service account")]
    checks.append(Check(NAME, "Kubernetes API reachable", True, f"namespace {eng.namespace}"))
    for verb, call in (("list pods", lambda: eng.core.list_namespaced_pod(eng.namespace, limit=1)),
                       ("read the session's secret", lambda: _probe_secret(eng))):
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
