"""Test kit for backend plugin authors: the conformance suite and a pytest plugin.

Run the suite against your backend by subclassing it in your package's tests::

    from fibercore.testing import BackendConformance

    class TestMyBackend(BackendConformance):
        backend = "slurm"                      # your fiber.backends entry-point name
        config = {"slurm_partition": "debug"}  # extra fibercore.init() values

Every in-repo backend (local, docker, k8s, aws) runs exactly this class.

The job targets live in :mod:`fibercore.testing.targets`, which does not import
pytest, so worker images need no test dependencies; the suite itself is imported
on first use.
"""

from typing import Any

__all__ = ["BackendConformance", "TransportConformance", "fiber", "in_ci", "interrupt_when", "session_of",
           "skip_or_fail", "write_demo_project"]

#: The helpers that run the ``fiber`` command as a user does (fibercore.testing.cli).
_CLI = ("fiber", "interrupt_when", "session_of", "write_demo_project")


def __getattr__(name: str) -> Any:
    if name == "TransportConformance":
        from fibercore.testing.transport import TransportConformance

        return TransportConformance
    if name == "BackendConformance":
        from fibercore.testing.conformance import BackendConformance

        return BackendConformance
    if name in ("in_ci", "skip_or_fail"):
        from fibercore.testing import ci

        return getattr(ci, name)
    if name in _CLI:
        from fibercore.testing import cli

        return getattr(cli, name)
    raise AttributeError(f"module 'fibercore.testing' has no attribute {name!r}")
