"""Real OpenSSH servers for the tests: Debian's ``sshd`` on 127.0.0.1 on a free port, with a
host key and a client key made per test session, stopped by its PID."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"

CONFIG = """Port {port}
ListenAddress {address}
HostKey {state}/host_ed25519
AuthorizedKeysFile {state}/authorized_keys
PidFile {state}/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
MaxStartups 64:30:128
MaxSessions 64
AcceptEnv no
Subsystem sftp internal-sftp
"""


def problem() -> str | None:
    """Why no sshd can be started here, or None."""
    for tool in (SSHD, shutil.which("ssh"), shutil.which("ssh-keygen")):
        if not tool or not os.path.exists(tool):
            return "openssh-server/openssh-client is missing: apt-get install openssh-server (scripts/test does it as root on Debian)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def keygen(path: Path) -> str:
    """An ed25519 key pair at ``path``; returns the public key line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return (path.parent / (path.name + ".pub")).read_text().strip()


class Sshd:
    """One sshd with its own host key; ``client_key`` may log in as the current user."""

    def __init__(self, state: Path, client_public: str, address: str = "127.0.0.1") -> None:
        state.mkdir(parents=True, exist_ok=True)
        self.state = state
        self.address = address
        self.port = free_port()
        self.host_public = keygen(state / "host_ed25519")
        (state / "authorized_keys").write_text(client_public + "\n")
        (state / "sshd_config").write_text(CONFIG.format(port=self.port, address=address, state=state))
        Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
        subprocess.run([SSHD, "-f", str(state / "sshd_config"), "-E", str(state / "sshd.log")], check=True)
        self.pid = self._wait_pid()
        self._wait_port()

    def _wait_pid(self) -> int:
        for _ in range(100):
            try:
                return int((self.state / "sshd.pid").read_text())
            except (OSError, ValueError):
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not start: {(self.state / 'sshd.log').read_text()[-2000:]}")

    def _wait_port(self) -> None:
        for _ in range(100):
            with socket.socket() as s:
                if s.connect_ex((self.address, self.port)) == 0:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"sshd does not listen on {self.address}:{self.port}")

    def known_hosts_line(self) -> str:
        return f"[{self.address}]:{self.port} {self.host_public}"

    def stop(self) -> None:
        """Stop this sshd by its PID (its sessions end with their own processes)."""
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)
