"""Kubernetes backend: every Fiber process is a pod (``FIBER_BACKEND=kubernetes`` or ``k8s``;
chosen automatically inside a pod).

Pods run ``python -m fibercore.worker`` with the image's python, restartPolicy Never,
requests = limits from ``cpu``/``memory``/``gpu`` (``nvidia.com/gpu``), the session
secret from a Secret, labels with the session and process, and an ownerReference to
the master's pod when the master runs in the cluster. Status comes from one watch.
The work is in :mod:`fiber_k8s.engine` (the kubernetes client is imported on first use);
this module is the declarations. See the README and ``rbac.yaml``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fibercore import hookimpl
from fibercore.backendkit import EngineBackend

if TYPE_CHECKING:
    from fiber_k8s.engine import Engine
    from fibercore.types import ConfigView, Option

NAME = "kubernetes"


class KubernetesBackend(EngineBackend["Engine"]):
    FIBER_CONTRACT = 3
    NAME = NAME
    ALIASES = ("k8s",)
    DISTRIBUTION = "fiber-k8s"
    ENGINE_KEYS = ("k8s_kubeconfig", "k8s_context", "k8s_namespace")
    follows_logs = True
    copies_files = True  # to say how, since it cannot
    reach_check = "Kubernetes API reachable"
    reach_fix = "set k8s_kubeconfig / k8s_context (or KUBECONFIG), or run in a pod with a service account"

    def make_engine(self, config: ConfigView) -> Engine:
        from fiber_k8s.engine import Engine

        return Engine(config)

    @hookimpl
    def fiber_config_options(self) -> list[Option]:
        opt = self.option
        return [
            opt("k8s_kubeconfig", str, None, "kubeconfig file (default: KUBECONFIG or ~/.kube/config; in a pod: "
                                             "its service account)."),
            opt("k8s_context", str, None, "kubeconfig context (default: the current one)."),
            opt("k8s_namespace", str, None, "Namespace of the pods (default: the context's, or the pod's own)."),
            opt("k8s_service_account", str, None, "Service account of the pods (jobs that start jobs need the "
                                                  "rbac.yaml Role)."),
            opt("k8s_image_pull_secrets", str, None, "imagePullSecrets of the pods: NAME,..."),
            opt("k8s_image_pull_policy", str, "IfNotPresent", "imagePullPolicy of the worker container."),
            opt("k8s_node_selector", str, None, "nodeSelector: KEY=VALUE,..."),
            opt("k8s_tolerations", str, None, "tolerations as a JSON list (or @file.json / @file.yaml)."),
            opt("k8s_volumes", str, None, "volumes: KIND:SOURCE:MOUNT_PATH[:ro],... with KIND pvc, emptydir or "
                                          "hostpath."),
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
            opt("k8s_job_listen_host", str, None, "Address a pod advertises for the processes it starts (default: "
                                                  "its pod IP)."),
        ]

    @hookimpl
    def fiber_config_defaults(self) -> dict[str, Any]:
        """Creating a pod is one API call and the cluster schedules them in parallel: a Pool
        creates all its pods at once. Image pulls can be slow: starting waits 5 minutes."""
        return {"pool_start_concurrency": 0, "start_timeout": 300.0}

    @hookimpl
    def fiber_detect_backend(self) -> str | None:
        from fiber_k8s.engine import in_cluster

        return NAME if in_cluster() else None

    @hookimpl
    def fiber_listen_host(self, config: ConfigView) -> str:
        from fiber_k8s.engine import listen_host

        return listen_host(config)


plugin = KubernetesBackend()
