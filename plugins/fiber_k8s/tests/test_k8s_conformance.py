"""fiber-k8s runs fibercore's backend conformance suite on a real single-node cluster."""

from typing import Any

import pytest

from fibercore.testing import BackendConformance


class TestKubernetesBackend(BackendConformance):
    backend = "kubernetes"
    terminate_exitcode = -15  # pod deleted by terminate(): reported as SIGTERM, as multiprocessing does
    broken_python_exe = "/bin/false"  # exists in the image, is no Python
    timeout = 90.0

    @pytest.fixture
    def backend_config(self, k8s_config: dict[str, Any]) -> dict[str, Any]:
        return dict(k8s_config)
