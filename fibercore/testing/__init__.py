"""Test kit for backend plugin authors: the conformance suite and a pytest plugin.

Run the suite against your backend by subclassing it in your package's tests::

    from fibercore.testing import BackendConformance

    class TestMyBackend(BackendConformance):
        backend = "slurm"                      # your fiber.backends entry-point name
        config = {"slurm_partition": "debug"}  # extra fibercore.init() values

Every in-repo backend (local, docker, k8s, aws) runs exactly this class.
"""

from fibercore.testing.conformance import BackendConformance

__all__ = ["BackendConformance"]
