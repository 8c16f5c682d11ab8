"""Markers for the external resources a test needs, from the fixtures it uses, so that
``pytest -m "not needs_docker and not needs_k8s and not needs_slurm and not needs_sshd and
not needs_moto and not needs_cluster"`` is the quick run of a machine without them (CONTRIBUTING.md)."""

from __future__ import annotations

import os
import shutil
import tempfile
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
    "ssh_cluster": ("needs_docker", "needs_sshd", "needs_cluster"),
    "slurm_multinode": ("needs_docker", "needs_slurm", "needs_cluster"),
}


#: The test that checks every hook was really called by the suite (tests/test_hooks_called.py).
HOOKS_CALLED = "test_every_hook_is_called_by_the_suite"


def whole_suite(config: Any) -> bool:
    """Whether this run is the whole suite: the configured test paths, nothing deselected."""
    source = getattr(config, "args_source", None)
    return (source is not None and source.name == "TESTPATHS" and not config.option.keyword
            and not config.option.markexpr and not getattr(config.option, "lf", False))


def pytest_configure(config: Any) -> None:
    if whole_suite(config) and not os.environ.get("FIBERCORE_RECORD_HOOKS"):
        # Every process of the run (the jobs and fiber commands it starts inherit it) writes
        # down the hooks it calls; the last test reads them.
        config._fiber_hook_dir = tempfile.mkdtemp(prefix="fibercore-hooks-")
        os.environ["FIBERCORE_RECORD_HOOKS"] = config._fiber_hook_dir


def pytest_unconfigure(config: Any) -> None:
    directory = getattr(config, "_fiber_hook_dir", None)
    if directory:
        os.environ.pop("FIBERCORE_RECORD_HOOKS", None)
        shutil.rmtree(directory, ignore_errors=True)


#: Tests that only hold on the built-in transport, skipped when the suite runs on another
#: (``FIBER_TRANSPORT=nng``, as scripts/test does a second time): why, by marker.
OTHER_TRANSPORT_SKIPS = {
    "builtin_transport": "checks the built-in transport itself (its Unix sockets, its name in the output)",
    "forks_master": "uses fibercore objects in a child forked from a process that used the transport "
                    "(nng does not survive fork(); fiber-nng says so in one line, tested in its own suite)",
}


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    transport = os.environ.get("FIBER_TRANSPORT", "tcp")
    if transport != "tcp":
        for item in items:
            for marker, why in OTHER_TRANSPORT_SKIPS.items():
                if item.get_closest_marker(marker) is not None:
                    item.add_marker(pytest.mark.skip(reason=f"on transport {transport!r}: {why}"))
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, markers in NEEDS.items():
            if fixture in names:
                for marker in markers:
                    item.add_marker(getattr(pytest.mark, marker))
    # The multi-host cluster's tests run alone, after the others (they inject network faults
    # and own the machine's docker for a while); the hook check comes last of all.
    cluster = [item for item in items if item.get_closest_marker("needs_cluster") is not None]
    for item in cluster:
        items.remove(item)
        items.append(item)
    last = [item for item in items if item.name == HOOKS_CALLED]
    for item in last:  # after every other test: it reads what they called
        items.remove(item)
        items.append(item)
