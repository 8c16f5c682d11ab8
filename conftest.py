"""Markers for the external resources a test needs, from the fixtures it uses, so that
``pytest -m "not needs_docker and not needs_k8s and not needs_slurm and not needs_sshd and
not needs_moto"`` is the quick run of a machine without them (CONTRIBUTING.md)."""

from __future__ import annotations

from typing import Any

import pytest

#: Fixture -> the resources a test that uses it needs (a fixture's own fixtures count too:
#: pytest lists them all in ``item.fixturenames``).
NEEDS = {
    "docker_client": ("needs_docker",),
    "docker_image": ("needs_docker",),
    "second_host": ("needs_docker", "needs_sshd"),
    "worker_image": ("needs_docker",),
    "moto_url": ("needs_moto",),
    "kubeconfig": ("needs_k8s",),
    "slurm_conf": ("needs_slurm",),
    "ssh_keys": ("needs_sshd",),
}


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, markers in NEEDS.items():
            if fixture in names:
                for marker in markers:
                    item.add_marker(getattr(pytest.mark, marker))
