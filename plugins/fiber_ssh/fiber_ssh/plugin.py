"""SSH backend: every Fiber process is a process on one of a list of hosts
(``FIBER_BACKEND=ssh``, hosts from ``ssh_hosts`` or ``ssh_hostfile``).

A job goes to the host with the most free slots; it runs in its own process group, which
terminate/kill signal; its output streams back to the master; a host whose connection is
lost has its jobs reported killed, so a Pool reruns their tasks elsewhere. The session
secret goes to the job over the ssh session's stdin and on through an inherited pipe, never
on a command line. The work is in :mod:`fiber_ssh.engine`; this module is the declarations.
Written on fibercore's public names only, as a third party would.
"""

from __future__ import annotations

import shutil
from typing import TYPE_CHECKING

from fibercore import hookimpl
from fibercore.backendkit import EngineBackend, outward_address

if TYPE_CHECKING:
    from fiber_ssh.engine import Engine
    from fibercore.types import Check, ConfigView, Option

NAME = "ssh"


class SshBackend(EngineBackend["Engine"]):
    FIBER_CONTRACT = 3
    NAME = NAME
    DISTRIBUTION = "fiber-ssh"
    ENGINE_KEYS = ("ssh_hosts", "ssh_hostfile", "ssh_port", "ssh_identity", "ssh_options", "ssh_python",
                   "ssh_connect_timeout", "ssh_host_retry", "ssh_multiplex", "ssh_echo_output")
    reach_check = "hosts configured"
    reach_fix = "set ssh_hosts or ssh_hostfile"

    def make_engine(self, config: ConfigView) -> Engine:
        from fiber_ssh.engine import Engine

        return Engine(config)

    def doctor(self, config: ConfigView) -> list[Check]:
        from fibercore.types import Check

        if shutil.which("ssh") is None:
            return [Check(NAME, "ssh client", False, "not found", "apt-get install openssh-client")]
        return super().doctor(config)

    @hookimpl
    def fiber_config_options(self) -> list[Option]:
        opt = self.option
        return [
            opt("ssh_hosts", str, None, "Hosts as `[user@]host[:slots]`, comma-separated (Open MPI's -H); "
                "a host without :slots gets its CPU count."),
            opt("ssh_hostfile", str, None, "A file of hosts, one per line: `[user@]host slots=N port=P python=PATH` "
                                           "(only the host is required)."),
            opt("ssh_port", int, None, "Port of every host's sshd (default: ~/.ssh/config, else 22)."),
            opt("ssh_identity", str, None, "Private key file (ssh -i); default: the agent and ~/.ssh."),
            opt("ssh_options", str, None, "Extra ssh client options, e.g. -o StrictHostKeyChecking=accept-new."),
            opt("ssh_python", str, None, "Interpreter on the hosts (default: this one's path; per host: python= in "
                                         "the hostfile)."),
            opt("ssh_connect_timeout", float, 10.0, "Seconds ssh waits for a host to answer."),
            opt("ssh_host_retry", float, 30.0, "Seconds a host whose connection failed is skipped before it is "
                                               "tried again."),
            opt("ssh_multiplex", bool, True, "Share one connection per host between sessions (OpenSSH "
                                             "ControlMaster)."),
            opt("ssh_echo_output", bool, True, "Echo the jobs' output to the master's stdout/stderr."),
        ]

    @hookimpl
    def fiber_listen_host(self, config: ConfigView) -> str:
        """127.0.0.1 when every host is this machine, else the address that routes outward."""
        from fiber_ssh.hosts import hosts_from_config

        hosts = hosts_from_config(config.get("ssh_hosts"), config.get("ssh_hostfile"))
        if all(h.address in ("localhost", "127.0.0.1", "::1") for h in hosts):
            return "127.0.0.1"
        return outward_address()


plugin = SshBackend()
