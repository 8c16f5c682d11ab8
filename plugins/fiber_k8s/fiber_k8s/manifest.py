"""From a JobSpec and the configuration to a Pod manifest (pure functions, plain dicts).

Plain dicts in the API's JSON shape (not the client's model classes), so that a test
can validate every option against the API's schema (kubernetes-validate) and the
server's dry-run, and so that ``k8s_pod_patch`` (a JSON merge patch) applies to exactly
what is sent.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fibercore import backendkit

if TYPE_CHECKING:
    from fibercore.types import ConfigView

SECRET_KEY = "FIBER_SECRET"
WORKER_CONTAINER = "worker"


class K8sOptionError(ValueError):
    """A k8s_* config value cannot be used; the message shows the expected form."""


def label_value(text: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9-_.], alphanumeric at both ends."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:63].strip("-_.")
    return value or "x"


def pod_name(session: str, process_name: str, suffix: str) -> str:
    """A DNS-1123 subdomain: ``fiber-<session>-<process>-<suffix>``."""
    slug = re.sub(r"[^a-z0-9-]+", "-", process_name.lower()).strip("-")[:40] or "job"
    return f"fiber-{session}-{slug}-{suffix}"


def secret_name(session: str) -> str:
    return f"fiber-{session}"


def parse_pairs(text: str | None, key: str) -> dict[str, str]:
    return backendkit.parse_pairs(text, key, K8sOptionError, "disktype=ssd,zone=a")


def parse_json(text: str | None, key: str, kind: type) -> Any:
    """A JSON value from config, or ``@path`` to a JSON or YAML file."""
    if not text:
        return kind()
    source = text
    if text.startswith("@"):
        path = os.path.expanduser(text[1:])
        try:
            with open(path) as fh:
                source = fh.read()
        except OSError as exc:
            raise K8sOptionError(f"{key}: cannot read {path}: {exc}") from None
        if path.endswith((".yaml", ".yml")):
            import yaml

            value = yaml.safe_load(source)
            if not isinstance(value, kind):
                raise K8sOptionError(f"{key}: {path} must hold a {kind.__name__}")
            return value
    try:
        value = json.loads(source)
    except ValueError as exc:
        raise K8sOptionError(f"{key} is not valid JSON ({exc}); give JSON or @file.json/@file.yaml") from None
    if not isinstance(value, kind):
        raise K8sOptionError(f"{key} must be a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def parse_volumes(text: str | None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``k8s_volumes``: ``KIND:SOURCE:MOUNT_PATH[:ro],...`` with KIND pvc (SOURCE a claim),
    emptydir (SOURCE a name) or hostpath (SOURCE a path on the node)."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for i, item in enumerate(filter(None, (part.strip() for part in (text or "").split(",")))):
        pieces = item.split(":")
        if len(pieces) not in (3, 4) or pieces[0].lower() not in ("pvc", "emptydir", "hostpath"):
            raise K8sOptionError(
                f"k8s_volumes entry {item!r} is not KIND:SOURCE:MOUNT_PATH[:ro] with KIND pvc, emptydir or "
                "hostpath; example: k8s_volumes=pvc:datasets:/data:ro,emptydir:scratch:/scratch"
            )
        kind, source, path = pieces[0].lower(), pieces[1], pieces[2]
        read_only = len(pieces) == 4 and pieces[3] == "ro"
        if len(pieces) == 4 and pieces[3] not in ("ro", "rw"):
            raise K8sOptionError(f"k8s_volumes entry {item!r}: the mode must be ro or rw")
        if not path.startswith("/"):
            raise K8sOptionError(f"k8s_volumes entry {item!r}: the mount path must be absolute")
        name = f"fiber-vol-{i}"
        if kind == "pvc":
            volume: dict[str, Any] = {"name": name,
                                      "persistentVolumeClaim": {"claimName": source, "readOnly": read_only}}
        elif kind == "emptydir":
            volume = {"name": name, "emptyDir": {}}
        else:
            volume = {"name": name, "hostPath": {"path": source, "type": "Directory"}}
        volumes.append(volume)
        mounts.append({"name": name, "mountPath": path, "readOnly": read_only})
    return volumes, mounts


def resources(cpu: float | None, memory: int | None, gpu: int | None) -> dict[str, Any]:
    """Requests and limits (equal: Guaranteed QoS, what a job asked for is what it gets)."""
    amounts: dict[str, str] = {}
    if cpu:
        amounts["cpu"] = f"{int(round(float(cpu) * 1000))}m"
    if memory:
        amounts["memory"] = f"{int(memory)}Mi"
    if gpu:
        amounts["nvidia.com/gpu"] = str(int(gpu))
    return {"requests": dict(amounts), "limits": dict(amounts)} if amounts else {}


def _named(items: Any) -> bool:
    return isinstance(items, list) and all(isinstance(i, dict) and "name" in i for i in items)


def merge_patch(target: Any, patch: Any) -> Any:
    """JSON merge patch (RFC 7386: objects merge, null deletes, values replace), plus one
    rule of Kubernetes' strategic merge: lists of named objects (containers, env,
    volumes) merge item by item on ``name``, so a patch can touch the ``worker``
    container without repeating it."""
    if isinstance(patch, list) and _named(patch) and _named(target):
        out = [dict(item) for item in target]
        index = {item["name"]: i for i, item in enumerate(out)}
        for item in patch:
            if item["name"] in index:
                out[index[item["name"]]] = merge_patch(out[index[item["name"]]], item)
            else:
                out.append(item)
        return out
    if not isinstance(patch, dict):
        return patch
    out_map = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out_map.pop(key, None)
        else:
            out_map[key] = merge_patch(out_map.get(key), value)
    return out_map


def pod_manifest(
    spec: Any,
    cfg: ConfigView,
    *,
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    owner: Mapping[str, Any] | None,
    secret: str | None,
) -> dict[str, Any]:
    """The Pod for ``spec`` (fibercore.types.JobSpec): restartPolicy Never, the image's
    python, env (the secret by secretKeyRef), resources, volumes, scheduling options,
    labels and the owner, then ``k8s_pod_patch`` merged in."""
    image = spec.image or cfg.get("default_image")
    if not image:
        raise K8sOptionError("no image: set image=... (FIBER_IMAGE) to a worker image the cluster can pull")
    command = spec.argv("python")  # unless python_exe was set: the image's, found on its PATH
    env = [{"name": k, "value": str(v)} for k, v in sorted({**spec.env, "PYTHONUNBUFFERED": "1"}.items())]
    if secret:
        env.append({"name": SECRET_KEY, "valueFrom": {"secretKeyRef": {"name": secret, "key": SECRET_KEY}}})
    else:
        env += [{"name": k, "value": v} for k, v in sorted(spec.secret_env.items())]
    env.append({"name": "FIBERCORE_K8S_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    volumes, mounts = parse_volumes(cfg.get("k8s_volumes"))
    container: dict[str, Any] = {
        "name": WORKER_CONTAINER,
        "image": image,
        "command": command,
        "env": env,
        "imagePullPolicy": cfg.get("k8s_image_pull_policy") or "IfNotPresent",
    }
    res = resources(spec.cpu, spec.memory, spec.gpu)
    if res:
        container["resources"] = res
    if mounts:
        container["volumeMounts"] = mounts
    if cfg.get("k8s_workdir"):
        container["workingDir"] = cfg["k8s_workdir"]
    all_labels = {k: label_value(v) for k, v in parse_pairs(cfg.get("k8s_labels"), "k8s_labels").items()}
    all_labels.update({k: label_value(v) for k, v in (spec.labels or {}).items()})
    all_labels.update(labels)
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": all_labels,
                                "annotations": {"fibercore/process": spec.name}}
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "terminationGracePeriodSeconds": int(cfg.get("k8s_grace_period") or 0),
        "enableServiceLinks": False,
    }
    if volumes:
        pod_spec["volumes"] = volumes
    if cfg.get("k8s_host_network"):
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    node_selector = parse_pairs(cfg.get("k8s_node_selector"), "k8s_node_selector")
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = parse_json(cfg.get("k8s_tolerations"), "k8s_tolerations", list)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    if cfg.get("k8s_service_account"):
        pod_spec["serviceAccountName"] = cfg["k8s_service_account"]
    pull_secrets = [s.strip() for s in (cfg.get("k8s_image_pull_secrets") or "").split(",") if s.strip()]
    if pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s} for s in pull_secrets]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
    patch = parse_json(cfg.get("k8s_pod_patch"), "k8s_pod_patch", dict)
    return merge_patch(pod, patch) if patch else pod


def secret_manifest(name: str, namespace: str, secret_hex: str, labels: Mapping[str, str],
                    owner: Mapping[str, Any] | None) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": dict(labels)}
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque", "metadata": metadata,
            "stringData": {SECRET_KEY: secret_hex}}
