"""A router hub never loses frames to a fast sender (nng's polyamorous pair would drop them)."""

from __future__ import annotations

import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fibercore as mp
from fibercore.errors import TransportError


def _pair():
    rt = mp.get_runtime()
    hub = rt.listen("router")
    spoke = rt.dial("router", hub.address)
    spoke.send([(1, [b"hello"])])
    messages, peer = hub.recv(timeout=10)
    assert messages[0][0] == 1
    return hub, spoke, peer


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(count=st.integers(100, 3000), size=st.integers(1, 2000))
def test_every_message_a_hub_sends_arrives_in_order(count, size):
    hub, spoke, peer = _pair()
    received: list[int] = []
    done = threading.Event()

    def read() -> None:
        while len(received) < count:
            messages, _ = spoke.recv(timeout=30)
            received.extend(int.from_bytes(bytes(parts[0][:4]), "little") for _, parts in messages)
        done.set()

    def credit_pump() -> None:  # a hub receives continuously; credit arrives that way
        while not done.is_set():
            try:
                hub.recv(timeout=0.05)
            except TransportError:  # timeouts while the spoke catches up
                pass

    threads = [threading.Thread(target=read), threading.Thread(target=credit_pump)]
    for t in threads:
        t.start()
    payload = b"x" * size
    for i in range(count):
        hub.send([(2, [i.to_bytes(4, "little") + payload])], peer)
    assert done.wait(60), f"only {len(received)} of {count} messages arrived"
    for t in threads:
        t.join(10)
    assert received == list(range(count))
    hub.close()
    spoke.close()
