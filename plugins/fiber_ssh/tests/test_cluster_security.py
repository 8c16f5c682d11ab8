"""The multi-host test cluster attacked by a second local user (tests/attacker.py): what it
creates (a docker network and containers, sshd on each host, the client key mounted into
them, fault rules in each host's namespace) is out of that user's reach."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest


def _attack(docker_socket: str, key_dir: str, host_pid: int, address: str) -> dict[str, Any]:
    import socket
    import subprocess
    import tempfile

    out: dict[str, Any] = {}
    try:  # the docker API: the cluster's containers and networks are made through it
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(docker_socket)
            s.sendall(b"GET /containers/json HTTP/1.0\r\n\r\n")
            out["docker"] = s.recv(200).decode(errors="replace")
    except OSError as exc:
        out["docker"] = f"refused: {exc}"
    try:  # the client's private key, mounted into every host
        out["key"] = sorted(os.listdir(key_dir))
    except OSError as exc:
        out["key"] = f"refused: {exc}"
    # A host's network namespace, where the faults are injected.
    done = subprocess.run(["nsenter", "-t", str(host_pid), "-n", "iptables", "-S"], capture_output=True, text=True)
    out["nsenter"] = (done.returncode, done.stderr.strip()[-200:])
    # Its sshd, with a key of the attacker's own.
    work = tempfile.mkdtemp()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{work}/k"], check=True,
                   capture_output=True)
    done = subprocess.run(["ssh", "-T", "-i", f"{work}/k", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
                           "-o", "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", f"root@{address}", "id"],
                          capture_output=True, text=True, timeout=60)
    out["ssh"] = (done.returncode, done.stdout.strip(), done.stderr.strip()[-200:])
    return out


def test_another_local_user_reaches_no_part_of_the_cluster(ssh_cluster: Any, ssh_keys: dict[str, Any]) -> None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating a second local user needs root and useradd")
    from tests.attacker import LocalUser

    host = ssh_cluster.hosts[0]
    user = LocalUser()
    try:
        got = user.run(_attack, "/var/run/docker.sock", str(ssh_keys["dir"]), host.pid, host.address)
    finally:
        user.remove()
    assert got["docker"].startswith("refused"), got  # root:docker 0660: no container, network or pause
    assert str(got["key"]).startswith("refused"), got  # the key directory is 0700
    assert got["nsenter"][0] != 0, got  # no fault rule can be added or read
    assert got["ssh"][0] == 255 and "uid=" not in got["ssh"][1], got  # publickey refused
