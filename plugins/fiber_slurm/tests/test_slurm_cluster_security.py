"""The multi-node test Slurm attacked by a second local user (tests/attacker.py): its munge
key and sockets, the jobs' spool (secrets, output) and slurmctld's port, which listens on
every address of this machine, give that user nothing."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest


def _attack(state: str, spool: str, conf: str) -> dict[str, Any]:
    import subprocess

    out: dict[str, Any] = {}
    for what, path in (("key", f"{state}/munge.key"), ("munge_socket", f"{state}/run/munge.sock"),
                       ("spool", spool)):
        try:
            out[what] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path, "rb").read(8).hex()
        except OSError as exc:
            out[what] = f"refused: {exc.strerror}"
    # The configuration, as if learned (slurmctld's port is in /proc/net/tcp): submitting without
    # the cluster's munge key (its socket is out of reach; the system's, if any, has another key).
    import tempfile

    mine = os.path.join(tempfile.mkdtemp(), "slurm.conf")
    with open(mine, "w") as fh:
        fh.write(conf.replace(f"{state}/run/munge.sock", "/run/munge/munge.socket.2"))
    done = subprocess.run(["sbatch", "--wrap", "id > /tmp/slurm-attack-ran"], capture_output=True, text=True,
                          env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": mine}, timeout=60)
    out["sbatch"] = (done.returncode, done.stdout.strip(), done.stderr.strip()[-300:])
    return out


def test_another_local_user_cannot_use_the_multinode_slurm(slurm_multinode: Any) -> None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating a second local user needs root and useradd")
    from tests.attacker import LocalUser

    state = slurm_multinode.state
    user = LocalUser()
    try:
        got = user.run(_attack, str(state), str(state.parent / "spool"), slurm_multinode.conf.read_text())
    finally:
        user.remove()
    for what in ("key", "munge_socket", "spool"):  # the state and spool directories are 0700
        assert str(got[what]).startswith("refused"), got
    assert got["sbatch"][0] != 0 and not got["sbatch"][1], got  # no job id: nothing was submitted
    print(f"\nsbatch as another user: {got['sbatch'][2]}")
    assert not os.path.exists("/tmp/slurm-attack-ran")
