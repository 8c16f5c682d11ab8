"""Channels deliver every frame once and in order, small or spanning several records."""

from __future__ import annotations

import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fibercore as mp
from fibercore.errors import TransportError
from tests.helpers import connected_router


def _pair():
    return connected_router(mp.get_runtime())


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

    def credit_pump() -> None:  # a hub's owner receives all along (as every hub here does)
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


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(size=st.sampled_from([0, 1, (4 << 20) - 100, (4 << 20) + 1, 9 << 20]))
def test_frames_larger_than_a_record_arrive_whole(size):
    hub, spoke, peer = _pair()
    payload = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    got: list = []
    reader = threading.Thread(target=lambda: got.append(hub.recv(timeout=30)))
    reader.start()  # a frame bigger than the socket buffers needs a reader while it is sent
    spoke.send([(3, [payload, b"tail"])])
    reader.join(30)
    messages, got_peer = got[0]
    assert got_peer is peer and bytes(messages[0][1][0]) == payload and bytes(messages[0][1][1]) == b"tail"
    reader = threading.Thread(target=lambda: got.append(spoke.recv(timeout=30)))
    reader.start()
    hub.send([(4, [payload])], peer)
    reader.join(30)
    messages, _ = got[1]
    assert bytes(messages[0][1][0]) == payload
    hub.close()
    spoke.close()
