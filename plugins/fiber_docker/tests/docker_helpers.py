"""Constants and helpers of the docker tests (conftest.py names clash across test folders)."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[2]
RUN_ID = uuid.uuid4().hex[:12]
RUN_LABEL = f"fiber-test-run={RUN_ID}"


def docker_cli() -> list[str]:
    """The docker command line client (the issue's `docker kill`), else the SDK's path."""
    for path in ("/usr/bin/docker", "/usr/local/bin/docker"):
        if os.access(path, os.X_OK):
            return [path]
    return [sys.executable, "-c", "import sys, docker; docker.from_env().api.kill(sys.argv[2])"]
