"""Every pod option, as mapped (unit), as the API's schema accepts it (kubernetes-validate)
and as the real API server accepts it (server-side dry-run)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from fiber_k8s.engine import PodJob, _exitcode
from fiber_k8s.manifest import (
    K8sOptionError,
    label_value,
    merge_patch,
    parse_volumes,
    pod_manifest,
    pod_name,
    secret_manifest,
)
from hypothesis import given
from hypothesis import strategies as st

from fibercore.types import JobSpec

OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "master-0", "uid": "3f6f0c8e-0000-4000-8000-000000000001"}


def _spec(**kw: Any) -> JobSpec:
    base: dict[str, Any] = {
        "args": ["-m", "fibercore.worker"],
        "session": "0123456789ab",
        "env": {"FIBER_SESSION": "0123456789ab", "FIBER_MASTER_ADDR": "tcp://10.1.0.7:4000"},
        "secret_env": {"FIBER_SECRET": "ef" * 32},
        "name": "Pool-1-Worker-2",
        "image": "me/rl:1",
        "labels": {"fiber-session": "0123456789ab", "fiber-process": "Pool-1-Worker-2"},
    }
    base.update(kw)
    return JobSpec(**base)


def _pod(spec: JobSpec | None = None, owner: Any = None, **cfg: Any) -> dict[str, Any]:
    return pod_manifest(spec or _spec(), cfg, name=pod_name("0123456789ab", "Pool-1-Worker-2", "a1b2c3"),
                        namespace="default", labels={"fiber-backend": "kubernetes"}, owner=owner,
                        secret="fiber-0123456789ab")


EVERY_OPTION = {
    "k8s_volumes": "pvc:datasets:/data:ro,emptydir:scratch:/scratch,hostpath:/mnt/models:/models",
    "k8s_node_selector": "disktype=ssd,zone=a",
    "k8s_tolerations": json.dumps([{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]),
    "k8s_service_account": "fibercore",
    "k8s_image_pull_secrets": "regcred,other",
    "k8s_labels": "team=rl",
    "k8s_workdir": "/work",
    "k8s_host_network": True,
    "k8s_grace_period": 5,
    "k8s_image_pull_policy": "Always",
    "k8s_pod_patch": json.dumps({
        "metadata": {"annotations": {"example.com/owner": "rl-team"}},
        "spec": {"activeDeadlineSeconds": 86400, "containers": [
            {"name": "worker", "securityContext": {"runAsNonRoot": True, "runAsUser": 1000}}]},
    }),
}


def test_every_option_is_mapped() -> None:
    pod = _pod(_spec(cpu=1.5, memory=2048, gpu=1), owner=OWNER, **EVERY_OPTION)
    spec, c = pod["spec"], pod["spec"]["containers"][0]
    assert spec["restartPolicy"] == "Never"
    assert c["command"] == ["python", "-m", "fibercore.worker"]
    assert c["resources"] == {"requests": {"cpu": "1500m", "memory": "2048Mi", "nvidia.com/gpu": "1"},
                              "limits": {"cpu": "1500m", "memory": "2048Mi", "nvidia.com/gpu": "1"}}
    env = {e["name"]: e for e in c["env"]}
    assert env["FIBER_SECRET"]["valueFrom"] == {"secretKeyRef": {"name": "fiber-0123456789ab", "key": "FIBER_SECRET"}}
    assert "ef" * 32 not in json.dumps(pod)
    assert [v["name"] for v in spec["volumes"]] == ["fiber-vol-0", "fiber-vol-1", "fiber-vol-2"]
    assert spec["volumes"][0]["persistentVolumeClaim"] == {"claimName": "datasets", "readOnly": True}
    assert spec["volumes"][1]["emptyDir"] == {} and spec["volumes"][2]["hostPath"]["path"] == "/mnt/models"
    assert c["volumeMounts"][0] == {"name": "fiber-vol-0", "mountPath": "/data", "readOnly": True}
    assert spec["nodeSelector"] == {"disktype": "ssd", "zone": "a"}
    assert spec["tolerations"][0]["key"] == "gpu"
    assert spec["serviceAccountName"] == "fibercore"
    assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "other"}]
    assert spec["hostNetwork"] is True and spec["terminationGracePeriodSeconds"] == 5
    assert c["workingDir"] == "/work" and c["imagePullPolicy"] == "Always"
    assert pod["metadata"]["labels"] == {"team": "rl", "fiber-session": "0123456789ab",
                                         "fiber-process": "Pool-1-Worker-2", "fiber-backend": "kubernetes"}
    assert pod["metadata"]["ownerReferences"] == [OWNER]
    # the escape hatch: merged into the worker container by name, the rest kept
    assert c["securityContext"] == {"runAsNonRoot": True, "runAsUser": 1000} and c["image"] == "me/rl:1"
    assert spec["activeDeadlineSeconds"] == 86400
    assert pod["metadata"]["annotations"]["example.com/owner"] == "rl-team"


def _validate(obj: dict[str, Any]) -> None:
    import kubernetes_validate

    # 1.25 is the oldest schema kubernetes-validate ships; the Pod API is unchanged since 1.20
    kubernetes_validate.validate(obj, "1.25", strict=True)


def test_every_option_passes_the_api_schema() -> None:
    _validate(_pod(_spec(cpu=0.5, memory=256, gpu=2), owner=OWNER, **EVERY_OPTION))
    _validate(_pod())
    _validate(secret_manifest("fiber-0123456789ab", "default", "ef" * 32, {"fiber-session": "0123456789ab"}, OWNER))


def test_rbac_yaml_passes_the_api_schema_and_is_minimal() -> None:
    import yaml

    path = os.path.join(os.path.dirname(__file__), "..", "rbac.yaml")
    with open(path) as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d]
    for doc in docs:
        _validate(doc)
    role = next(d for d in docs if d["kind"] == "Role")
    assert {r for rule in role["rules"] for r in rule["resources"]} == {"pods", "pods/log", "secrets"}
    assert not any(d["kind"].startswith("Cluster") for d in docs)


def test_every_option_passes_the_servers_dry_run(core: Any) -> None:
    """The real API server (1.20) admits the manifests (validation, defaulting), without creating them."""
    created = core.create_namespaced_pod("default", _pod(_spec(cpu=0.5, memory=256, gpu=2), **EVERY_OPTION),
                                         dry_run="All")
    assert created.spec.containers[0].resources.limits == {"cpu": "500m", "memory": "256Mi", "nvidia.com/gpu": "2"}
    assert created.spec.containers[0].security_context.run_as_user == 1000  # the patch arrived
    core.create_namespaced_pod("default", _pod(), dry_run="All")
    assert core.list_namespaced_pod("default", label_selector="fiber-process=Pool-1-Worker-2").items == []
    secret = secret_manifest("fiber-dry-run", "default", "ef" * 32, {"fiber-session": "0123456789ab"}, None)
    core.create_namespaced_secret("default", secret, dry_run="All")


def test_rbac_yaml_passes_the_servers_dry_run(kubeconfig: Any) -> None:
    import yaml
    from kubernetes import client, config, utils

    api = config.new_client_from_config(config_file=str(kubeconfig))
    path = os.path.join(os.path.dirname(__file__), "..", "rbac.yaml")
    with open(path) as fh:
        for doc in filter(None, yaml.safe_load_all(fh)):
            utils.create_from_dict(api, doc, namespace="default", dry_run="All")
    assert client.RbacAuthorizationV1Api(api).list_namespaced_role("default").items == []


@pytest.mark.parametrize("text, fix", [
    ("datasets:/data", "KIND:SOURCE:MOUNT_PATH"),
    ("nfs:server:/data", "pvc, emptydir or hostpath"),
    ("pvc:datasets:data", "absolute"),
    ("pvc:datasets:/data:rx", "ro or rw"),
])
def test_bad_volumes_say_the_expected_form(text: str, fix: str) -> None:
    with pytest.raises(K8sOptionError, match=fix):
        parse_volumes(text)


def test_bad_json_options_say_the_expected_form(tmp_path: Any) -> None:
    with pytest.raises(K8sOptionError, match="not valid JSON"):
        _pod(k8s_tolerations="[{oops")
    with pytest.raises(K8sOptionError, match="must be a JSON list"):
        _pod(k8s_tolerations='{"key": "x"}')
    with pytest.raises(K8sOptionError, match="cannot read"):
        _pod(k8s_pod_patch=f"@{tmp_path}/missing.yaml")
    patch = tmp_path / "patch.yaml"
    patch.write_text("spec:\n  schedulerName: my-scheduler\n")
    assert _pod(k8s_pod_patch=f"@{patch}")["spec"]["schedulerName"] == "my-scheduler"


def test_no_image_is_a_clear_error() -> None:
    with pytest.raises(K8sOptionError, match="FIBER_IMAGE"):
        _pod(_spec(image=None))


def test_merge_patch_deletes_with_null_and_merges_named_lists() -> None:
    pod = _pod()
    patched = merge_patch(pod, {"spec": {"enableServiceLinks": None, "containers": [
        {"name": "worker", "env": [{"name": "EXTRA", "value": "1"}]}, {"name": "sidecar", "image": "busybox"}]}})
    assert "enableServiceLinks" not in patched["spec"]
    names = [c["name"] for c in patched["spec"]["containers"]]
    assert names == ["worker", "sidecar"]
    env = [e["name"] for e in patched["spec"]["containers"][0]["env"]]
    assert "EXTRA" in env and "FIBER_SESSION" in env
    assert pod["spec"]["enableServiceLinks"] is False  # the original is untouched


@given(st.text(max_size=120))
def test_names_and_label_values_are_valid(text: str) -> None:
    import re

    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", pod_name("0123456789ab", text, "a1b2c3"))
    value = label_value(text)
    assert len(value) <= 63 and re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", value)


@given(st.integers(min_value=0, max_value=255))
def test_exit_codes_follow_multiprocessing(status: int) -> None:
    job = PodJob("p")
    job.exit_status = status
    assert _exitcode(job) == (-(status - 128) if 128 < status <= 192 else status)


def test_deleted_pods_read_as_signals() -> None:
    job = PodJob("p")
    job.terminated_by = False
    assert _exitcode(job) == -15
    job.terminated_by = True
    assert _exitcode(job) == -9
    other = PodJob("q")
    other.deleted = True
    assert _exitcode(other) == -9
