"""Real sshd servers for the ssh backend's tests (sshd.py), keys made per test session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sshd

from fibercore.testing import skip_or_fail


@pytest.fixture(scope="session")
def ssh_keys(tmp_path_factory: Any) -> dict[str, Any]:
    why = sshd.problem()
    if why:
        skip_or_fail(why, "ssh")
    state = Path(tmp_path_factory.mktemp("ssh-client"))
    state.chmod(0o700)
    public = sshd.keygen(state / "id_ed25519")
    return {"dir": state, "key": state / "id_ed25519", "public": public, "known_hosts": state / "known_hosts"}


@pytest.fixture(scope="session")
def local_sshd(ssh_keys: dict[str, Any], tmp_path_factory: Any) -> Iterator[sshd.Sshd]:
    server = sshd.Sshd(Path(tmp_path_factory.mktemp("sshd")), ssh_keys["public"])
    with open(ssh_keys["known_hosts"], "a") as fh:
        fh.write(server.known_hosts_line() + "\n")
    yield server
    server.stop()


@pytest.fixture
def ssh_config(local_sshd: sshd.Sshd, ssh_keys: dict[str, Any]) -> dict[str, Any]:
    return {"ssh_hosts": "127.0.0.1:8", "ssh_port": local_sshd.port, "ssh_identity": str(ssh_keys["key"]),
            "ssh_options": sshd.client_options(ssh_keys["known_hosts"])}
