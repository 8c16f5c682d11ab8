"""The multi-node test Slurm attacked by a second local user (tests/attacker.py): its munge
key and sockets, the jobs' spool (secrets, output) and slurmctld's port, which listens on
every address of this machine, give that user nothing."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest


def _attack(state: str, spool: str, work: str) -> dict[str, Any]:
    """As the other user: read the cluster's secrets; then submit a job to slurmctld with a
    munged of its own (its own key: a credential slurmctld must refuse)."""
    import time

    out: dict[str, Any] = {}
    for what, path in (("key", f"{state}/munge.key"), ("munge_socket", f"{state}/run/munge.sock"),
                       ("spool", spool)):
        try:
            out[what] = sorted(os.listdir(path)) if os.path.isdir(path) else open(path, "rb").read(8).hex()
        except OSError as exc:
            out[what] = f"refused: {exc.strerror}"
    key = f"{work}/munge.key"
    with open(key, "wb") as fh:
        fh.write(os.urandom(1024))
    os.chmod(key, 0o400)
    started = subprocess.run(["/usr/sbin/munged", "--force", f"--socket={work}/munge.sock", f"--key-file={key}",
                              f"--pid-file={work}/munged.pid", f"--log-file={work}/munged.log",
                              f"--seed-file={work}/munge.seed"], capture_output=True, text=True)
    out["munged"] = (started.returncode, started.stderr.strip()[-300:])
    try:
        done = subprocess.run(["sbatch", "--wrap", "id"], capture_output=True, text=True, timeout=60,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SLURM_CONF": f"{work}/slurm.conf"})
        out["sbatch"] = (done.returncode, done.stdout.strip(), done.stderr.strip()[-400:])
    finally:
        try:
            os.kill(int(open(f"{work}/munged.pid").read().strip()), 15)
            time.sleep(0.2)
        except (OSError, ValueError):
            pass
    return out


def test_another_local_user_cannot_use_the_multinode_slurm(slurm_multinode: Any) -> None:
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("creating a second local user needs root and useradd")
    from tests.attacker import LocalUser

    state = slurm_multinode.state
    spool = state.parent / "spool"
    # What keeps the secrets: 0700 directories (whatever their parents), a 0400 key.
    for directory in (state, spool, *slurm_multinode.nodes):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE((state / "munge.key").stat().st_mode) == 0o400
    log = state / "log" / "slurmctld.log"
    log_before = log.stat().st_size
    user = LocalUser()
    work = Path(tempfile.mkdtemp(prefix="fibercore-slurm-attacker-"))
    try:
        # The configuration as if learned (slurmctld's port is in /proc/net/tcp), with the
        # attacker's own munge socket.
        (work / "slurm.conf").write_text(slurm_multinode.conf.read_text().replace(
            f"{state}/run/munge.sock", f"{work}/munge.sock"))
        os.chown(work, user.uid, user.gid)
        os.chmod(work, 0o700)
        got = user.run(_attack, str(state), str(spool), str(work))
        queued = subprocess.run(["squeue", "-h", "-u", str(user.uid)], capture_output=True, text=True,
                                env={**os.environ, "SLURM_CONF": str(slurm_multinode.conf)})
    finally:
        user.remove()
        shutil.rmtree(work, ignore_errors=True)
    for what in ("key", "munge_socket", "spool"):
        assert str(got[what]).startswith("refused"), got
    assert got["munged"][0] == 0, got  # its own munged ran: the request reached slurmctld signed
    assert got["sbatch"][0] != 0 and not got["sbatch"][1], got  # no job id: nothing was submitted
    assert queued.returncode == 0 and not queued.stdout.strip(), queued.stdout  # no job of that user
    refused = log.read_bytes()[log_before:].decode(errors="replace")
    # slurmctld itself refused it: the credential does not decode with the cluster's key.
    assert "Invalid credential" in refused and "REQUEST_SUBMIT_BATCH_JOB has authentication error" in refused, \
        refused[-2000:]
    print(f"\nsbatch as another user: {got['sbatch'][2]}\nslurmctld: {refused.strip()[-600:]}")
