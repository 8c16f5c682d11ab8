"""Pipe: the multiprocessing Connection API, order, EOF, bytes, poll."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fibercore as mp
from tests.helpers import array_roundtrip, pipe_bytes_echo, pipe_send_all


def test_same_process_duplex():
    a, b = mp.Pipe()
    a.send({"x": 1})
    assert b.recv() == {"x": 1}
    b.send_bytes(b"hello", 1, 3)
    assert a.recv_bytes() == b"ell"
    assert not a.poll(0.05)
    b.send(1)
    assert a.poll(5)
    assert a.recv() == 1


def test_simplex_directions():
    r, w = mp.Pipe(duplex=False)
    with pytest.raises(OSError):
        r.send(1)
    with pytest.raises(OSError):
        w.recv()
    w.send(5)
    assert r.recv() == 5


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.integers(), st.binary(max_size=2000), st.text(max_size=50)), max_size=400))
def test_order_preserved_across_processes(items):
    r, w = mp.Pipe(duplex=False)
    p = mp.Process(target=pipe_send_all, args=(w, items))
    p.start()
    w.close()  # as with multiprocessing: the parent's copy of the write end too
    got = [r.recv() for _ in items]
    if items:  # an end that never sent cannot signal EOF (documented limit)
        with pytest.raises(EOFError):
            r.recv()
    p.join(30)
    assert got == items


@given(st.lists(st.integers(), max_size=2000))
def test_order_preserved_in_process(items):
    a, b = mp.Pipe()
    for item in items:
        a.send(item)
    assert [b.recv() for _ in items] == items


def test_bytes_and_recv_bytes_into():
    a, b = mp.Pipe()
    p = mp.Process(target=pipe_bytes_echo, args=(b,))
    p.start()
    a.send_bytes(b"ab" * 1000)
    buf = bytearray(5000)
    n = a.recv_bytes_into(buf, 10)
    assert n == 4000 and bytes(buf[10:4010]) == b"ab" * 2000
    p.join(30)


def test_numpy_array_round_trip_writable():
    a, b = mp.Pipe()
    p = mp.Process(target=array_roundtrip, args=(b,))
    p.start()
    a.send(np.zeros((512, 512)))
    out = a.recv()
    assert out.shape == (512, 512) and float(out.sum()) == 512 * 512
    p.join(30)


def test_closed_connection_raises():
    a, b = mp.Pipe()
    a.close()
    assert a.closed
    with pytest.raises(OSError):
        a.send(1)
    with pytest.raises(EOFError):
        b.recv()


def test_connection_wait():
    from fibercore.connection import wait

    a, b = mp.Pipe()
    c, d = mp.Pipe()
    assert wait([b, d], timeout=0.05) == []
    a.send(1)
    assert wait([b, d], timeout=5) == [b]
