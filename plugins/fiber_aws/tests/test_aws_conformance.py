"""fiber-aws runs fibercore's backend conformance suite against moto's Batch, whose jobs
are real containers on the local dockerd."""

from typing import Any

import pytest

from fibercore.testing import BackendConformance


class TestAwsBatchBackend(BackendConformance):
    backend = "aws"
    terminate_exitcode = -15  # TerminateJob by terminate(): reported as SIGTERM, as multiprocessing does
    broken_python_exe = "/bin/false"  # exists in the image, is no Python
    timeout = 90.0

    @pytest.fixture
    def backend_config(self, aws_config: dict[str, Any]) -> dict[str, Any]:
        return dict(aws_config)
