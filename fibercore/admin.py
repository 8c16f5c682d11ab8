"""The admin channel: how a master hands work to the jobs it starts.

One router endpoint per process that starts children, served by one thread::

      master process                                    job (fibercore.worker)
    ┌───────────────────────────┐   tcp (authenticated)  ┌──────────────────────┐
    │ Process.start() ─register─▶ AdminHub thread ◀──────┤ dial, HELLO(token)   │
    │                           │  ── PREP(process) ────▶│ unpickle, run target │
    │ join()/is_alive ◀─ EXIT ──│  ◀──── EXIT(code) ─────┤                      │
    │                           │  ── PING every 2 s ───▶│ watchdog             │
    └───────────────────────────┘                        └──────────────────────┘

The wire protocol, step by step:
  1. ``Process.start()`` serializes the process object (target, args) and registers
     it under a random one-time token; the job's environment carries the master's
     address, the session id, the token and (by the backend's safest means) the
     session secret.
  2. The worker dials the master; the connection authenticates (the mutual
     handshake of :mod:`fibercore.wire.handshake`) and then the worker sends
     HELLO(token, pid, host). Frames that fail authentication are dropped unread.
  3. The hub answers PREP(prep data, process) to that peer only. A token is used
     once; an unknown token gets ERROR and nothing else.
  4. The worker runs the process and sends EXIT(exitcode) before it exits.
  5. The hub sends PING to every connected worker on another machine every
     ``heartbeat_interval``, and the worker answers PONG. A worker that hears nothing
     for ``heartbeat_timeout``, or whose connection closes, exits by itself: a dead or
     cut-off master leaves no orphan jobs. Symmetrically, a worker silent for
     ``heartbeat_timeout`` (its host partitioned, frozen or gone without a FIN) is
     declared lost: its connection is dropped and :attr:`Launch.lost` says why, which
     its Process reports as an exit (-9) and a Pool as a lost worker whose tasks rerun.
     Both sides use the same bound, so a stale job ends by itself by the time its
     master has given up on it.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Hashable
from typing import Any

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.runtime import Runtime, get_runtime
from fibercore.util import machine_identity
from fibercore.wire import malformed

log = logging.getLogger("fibercore.admin")

HELLO, PREP, EXIT, PING, ERROR, PONG = 1, 2, 3, 4, 5, 6
#: HELLO's fourth part from a worker that answers PING with PONG, followed by its machine
#: identity (older workers send three parts).
ANSWERS_PING = b"pong"


class Launch:
    """What the hub knows about one started child."""

    def __init__(self, token: str, payload: list[Any]) -> None:
        self.token = token
        self.payload = payload
        self.connected = threading.Event()
        self.gone = threading.Event()  # connection lost or EXIT received
        self.peer: Hashable | None = None
        self.remote_pid: int | None = None
        self.remote_host: str | None = None
        self.remote_machine = ""  # its machine identity, when its worker said it (PONG-capable)
        self.reported_exit: int | None = None
        self.watched = False  # on another machine and answers PING: may be declared lost
        self.last_heard = 0.0  # monotonic time of its last message
        self.lost: str | None = None  # why the hub declared it lost (silent past the bound)


class AdminHub:
    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self.channel = rt.listen("router", service="admin")
        self.address = self.channel.address
        self._lock = threading.Lock()
        self._launches: dict[str, Launch] = {}
        self._by_peer: dict[Hashable, Launch] = {}
        self._interval = float(rt.config.get("heartbeat_interval") or 2.0)
        self._silence = float(rt.config.get("heartbeat_timeout") or 20.0)
        self.channel.on_peer_event(self._peer_event)
        self._thread = threading.Thread(target=self._serve, name="fiber-admin", daemon=True)
        self._thread.start()

    def register(self, payload: list[Any]) -> Launch:
        launch = Launch(secrets.token_hex(16), payload)
        with self._lock:
            self._launches[launch.token] = launch
        return launch

    def forget(self, launch: Launch) -> None:
        with self._lock:
            self._launches.pop(launch.token, None)
            if launch.peer is not None:
                self._by_peer.pop(launch.peer, None)

    def _peer_event(self, peer: Hashable, added: bool) -> None:
        if added:
            return
        with self._lock:
            launch = self._by_peer.pop(peer, None)
        if launch is not None:
            launch.gone.set()

    def _remote_peers(self) -> list[Hashable]:
        """The jobs on other machines: only they need heartbeats (a job on this machine has a
        private connection, which the kernel ends at once when either side exits)."""
        with self._lock:
            return [peer for peer in self._by_peer if not getattr(peer, "private", False)]

    def _serve(self) -> None:
        last_ping = time.monotonic()
        while True:
            # Idle with only local jobs: no wake-ups at all (a HELLO from a remote job wakes it).
            wait = self._interval if self._remote_peers() else None
            try:
                messages, peer = self.channel.recv(timeout=wait)
            except TransportTimeout:
                messages, peer = [], None
            except TransportClosed:
                return
            for op, parts in messages:
                try:
                    self._handle(op, parts, peer)
                except TransportClosed:  # the job left before the answer (a pool terminated as it started)
                    pass
                except Exception as exc:  # a malformed but authentic message must not kill the hub
                    malformed(self.channel.address, peer, op, exc)
            now = time.monotonic()
            if now - last_ping >= self._interval:
                last_ping = now
                self._ping()

    def _handle(self, op: int, parts: list[memoryview], peer: Hashable) -> None:
        if op == PONG:
            with self._lock:
                launch = self._by_peer.get(peer)
            if launch is not None:
                launch.last_heard = time.monotonic()
        elif op == HELLO:
            token = bytes(parts[0]).decode()
            with self._lock:
                launch = self._launches.get(token)
                if launch is not None and launch.peer is None:
                    launch.peer = peer
                    self._by_peer[peer] = launch
                else:
                    launch = None
            if launch is None:
                log.warning("admin: HELLO with an unknown or reused token from %r", peer)
                self.channel.send([(ERROR, [b"unknown or already used token"])], peer)
                return
            launch.remote_pid = int(bytes(parts[1]))
            launch.remote_host = bytes(parts[2]).decode()
            self.channel.send([(PREP, launch.payload)], peer)
            launch.payload = []  # the token is spent; free the pickled process
            # Watched (declared lost when silent) only on another machine: a job here whose
            # process dies closes its connections at once, and one that is merely busy is alive.
            answer = bytes(parts[3]) if len(parts) > 3 else b""
            machine = answer[len(ANSWERS_PING) + 1:].decode(errors="replace")
            launch.remote_machine = machine
            launch.last_heard = time.monotonic()  # after PREP went: its size is not silence
            launch.watched = (answer.startswith(ANSWERS_PING) and not getattr(peer, "private", False)
                              and machine != machine_identity())
            launch.connected.set()
        elif op == EXIT:
            with self._lock:
                launch = self._by_peer.get(peer)
            if launch is not None:
                launch.reported_exit = int(bytes(parts[0]))
                launch.watched = False  # it said how it ended: its silence now means nothing
                launch.gone.set()

    def _ping(self) -> None:
        now = time.monotonic()
        for peer in self._remote_peers():
            with self._lock:
                launch = self._by_peer.get(peer)
            if launch is not None and launch.watched and now - launch.last_heard > self._silence:
                self._declare_lost(peer, launch, now - launch.last_heard)
                continue
            try:
                # Never blocks: a peer whose buffers are full (frozen) is judged by its silence.
                self.channel.send([(PING, [])], peer, block=False)
            except Exception:  # the peer went away meanwhile, or its buffers are full
                pass

    def _declare_lost(self, peer: Hashable, launch: Launch, silent: float) -> None:
        """A remote worker silent past ``heartbeat_timeout``: drop its connection (nothing
        more is read from it) and mark its launch lost; it ends itself on its side when it
        hears nothing from here for the same bound."""
        launch.lost = (f"its worker on {launch.remote_host} (pid {launch.remote_pid}) was silent for "
                       f"{silent:.1f} s (heartbeat_timeout={self._silence:g} s): host partitioned, frozen "
                       "or gone")
        log.warning("admin: %s; declared lost", launch.lost)
        with self._lock:
            self._by_peer.pop(peer, None)
        self.channel.drop(peer)
        launch.gone.set()
        if launch.remote_host is not None and launch.remote_pid is not None:
            from fibercore import liveness

            liveness.declare_lost(launch.remote_host, launch.remote_pid, launch.remote_machine)

    def close(self) -> None:
        self.channel.close()


_hubs: dict[tuple[str, str, bool, bool], AdminHub] = {}
_hub_lock = threading.Lock()


def get_hub() -> AdminHub:
    """The hub jobs of the current configuration connect to.

    One per advertised address: ``init()`` may switch the backend or its network (a
    bridge instead of the host's), and jobs started afterwards must reach a listener
    on the new address; hubs of earlier jobs stay up for them.
    """
    rt = get_runtime()
    key = rt.listener_kind
    hub = _hubs.get(key)
    if hub is None:
        with _hub_lock:
            hub = _hubs.get(key)
            if hub is None:
                hub = _hubs[key] = AdminHub(rt)
    return hub
