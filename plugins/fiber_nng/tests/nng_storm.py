"""A storm of fiber-nng dialers, run as its own process: an abort inside nng ends this process
(SIGABRT), never the test that started it.

    python nng_storm.py DIALERS CUT THREADS [REDIAL_MS]

``DIALERS`` full fiber-nng dials (handshake, one frame, close) to a real listener, beside
``CUT`` dialling sockets made as fiber-nng makes them, pointed at a port whose every connection
is cut at once, and closed after 0-10 ms, over ``THREADS`` threads. ``REDIAL_MS`` overrides
fiber-nng's redial delay for the cut sockets (the control: nng's own redial, made fast).
Prints ``delivered N`` and exits 0 when every frame arrived.
"""

from __future__ import annotations

import os
import random
import socket
import sys
import threading
import time

import pynng
from fiber_nng.transport import NngTransport, _new_socket

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.transport import Authenticator


def cutting_port(accepted: list[float] | None = None) -> tuple[socket.socket, int]:
    """A port whose every connection is closed as soon as it is accepted (the time of each
    accept appended to ``accepted``)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(512)

    def cut() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            if accepted is not None:
                accepted.append(time.monotonic())
            conn.close()

    threading.Thread(target=cut, daemon=True).start()
    return srv, srv.getsockname()[1]


def main(dialers: int, cut: int, threads: int, redial_ms: int | None) -> int:
    key = os.urandom(32)
    auth = Authenticator(key, "router", service="storm")
    listener = NngTransport().listen("router", "127.0.0.1", auth=auth)
    srv, cut_port = cutting_port()
    delivered = 0
    done = threading.Event()

    def drain() -> None:
        nonlocal delivered
        while not done.is_set() or delivered < dialers:
            try:
                listener.recv(timeout=0.5)
            except TransportTimeout:
                continue
            except TransportClosed:
                return
            delivered += 1

    def dial_one() -> None:
        dialer = NngTransport().dial("router", listener.address,
                                     auth=Authenticator(key, "router", service="storm", expect=auth.identity))
        dialer.send_parts([b"x"])
        dialer.close()

    def cut_one() -> None:
        sock = _new_socket(pynng.Req0, dialling=True)
        if redial_ms is not None:
            sock.reconnect_time_min = sock.reconnect_time_max = redial_ms
        sock.dial(f"tcp://127.0.0.1:{cut_port}", block=False)
        time.sleep(random.uniform(0, 0.01))
        sock.close()

    def work(k: int) -> None:
        share = [dial_one] * (dialers // threads + (k < dialers % threads))
        share += [cut_one] * (cut // threads + (k < cut % threads))
        random.shuffle(share)
        for step in share:
            step()

    drainer = threading.Thread(target=drain)
    drainer.start()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done.set()
    drainer.join(timeout=60)
    listener.close()
    srv.close()
    print(f"delivered {delivered}", flush=True)
    return 0 if delivered == dialers else 1


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    sys.exit(main(args[0], args[1], args[2], args[3] if len(args) > 3 else None))
