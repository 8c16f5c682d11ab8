"""The built-in transport's fast paths, over real sockets of this process: a frame written in
one sendmsg (or, when the socket is full, the rest of it), one-record frames parsed without
copying twice, one-message frames opened without a loop, and the stream opener's replay rule.

Each property compares what arrives with what was sent, byte for byte and in order, for
frames of parts of every shape a caller passes (bytes, bytearrays, empty parts, memoryviews
of other formats than bytes, such as a numpy array's) and with ``block=False``.
"""

from __future__ import annotations

import array
import os
import socket
import struct
import sys
import threading
import time
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fibercore.builtins.cloudpickle_serializer import CloudpickleSerializer, _plain_data
from fibercore.errors import TransportTimeout
from fibercore.runtime import get_runtime
from fibercore.wire.frames import BadFrame, StreamOpener, StreamSealer


@pytest.fixture(scope="module")
def pair():
    """A listening router channel and a channel dialled to it (a private Unix stream here)."""
    rt = get_runtime()
    listener = rt.listen("router", service="test")
    dialler = rt.dial("router", listener.address, service="test")
    dialler.send([(1, [b"hello"])])
    [(op, parts)], peer = listener.recv(10)
    assert bytes(parts[0]) == b"hello"
    yield listener, dialler, peer
    dialler.close()
    listener.close()


def _as_bytes(part):
    return memoryview(part).cast("B").tobytes() if not isinstance(part, (bytes, bytearray)) else bytes(part)


shapes = st.one_of(
    st.binary(max_size=300),
    st.just(b""),
    st.lists(st.integers(0, 2**64 - 1), max_size=40).map(lambda xs: memoryview(array.array("Q", xs))),
    st.lists(st.floats(allow_nan=False), max_size=40).map(lambda xs: memoryview(np.array(xs, dtype=np.float64))),
    st.integers(0, 100_000).map(lambda n: bytearray(b"z" * n)),
)


@settings(max_examples=60, deadline=None)
@given(frames=st.lists(st.lists(shapes, max_size=6), min_size=1, max_size=8), block=st.booleans())
def test_every_part_arrives_as_sent_in_order(pair, frames, block):
    listener, dialler, peer = pair

    def send_all() -> None:
        for parts in frames:
            while True:
                try:
                    dialler.send([(7, parts)], block=block)
                    break
                except TransportTimeout:  # block=False on a full socket: nothing went out, again
                    time.sleep(0.001)

    sender = threading.Thread(target=send_all)
    sender.start()
    for parts in frames:
        [(op, got)], _ = listener.recv(10)
        assert op == 7
        assert [bytes(g) for g in got] == [_as_bytes(p) for p in parts]
    sender.join(10)


def test_many_small_frames_read_together_and_a_big_one_split_across_reads(pair):
    listener, dialler, peer = pair
    big = np.arange(3_000_000, dtype=np.float64)  # 24 MB: several records, many reads

    def send_all() -> None:
        for i in range(500):
            listener.send([(2, [i.to_bytes(4, "little")])], peer)
        listener.send([(3, [memoryview(big)])], peer)

    sender = threading.Thread(target=send_all)
    sender.start()
    time.sleep(0.2)  # the small frames wait in the socket: one read takes many of them
    for i in range(500):
        [(op, got)], _ = dialler.recv(10)
        assert (op, bytes(got[0])) == (2, i.to_bytes(4, "little"))
    [(op, got)], _ = dialler.recv(30)
    assert op == 3 and np.array_equal(np.frombuffer(got[0], dtype=np.float64), big)
    sender.join(10)


@pytest.mark.builtin_transport  # the built-in transport's record reader
@pytest.mark.parametrize("path", ["unix", "tcp"])
def test_a_frame_of_many_records_is_held_once_while_it_is_read(path, monkeypatch):
    """A 20 MB frame (five records) is read into one anonymous mapping grown in place and,
    over the network, decrypted over itself: the message is a view of that one mapping of the
    frame's size, and the reader allocates under a record besides (it held the frame twice
    once: the records, then their join; then a zero-filled copy, then the clear text)."""
    import mmap
    import tracemalloc

    from fibercore.builtins.tcp import local as tcp_local
    from tests.helpers import connected_router

    monkeypatch.setattr(tcp_local, "LOCAL_SOCKETS", path == "unix")
    listener, dialler, peer = connected_router(get_runtime())
    big = np.arange(20 * 2**20 // 8, dtype=np.float64)
    sealed = threading.Event()  # the sender's sealed copy (in this process) is not the reader's
    seal = peer.sealer.seal
    peer.sealer.seal = lambda messages: (seal(messages), sealed.set())[0]
    sender = threading.Thread(target=listener.send, args=([(5, [memoryview(big)])], peer))
    sender.start()
    try:
        assert sealed.wait(30)
        tracemalloc.start()
        try:
            [(op, got)], _ = dialler.recv(30)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        sender.join(10)
        assert op == 5 and np.array_equal(np.frombuffer(got[0], dtype=np.float64), big)
        frame = got[0].obj
        assert isinstance(frame, mmap.mmap) and big.nbytes < len(frame) < big.nbytes + 4096, type(frame)
        assert peak < 1 << 20, f"the reader allocated {peak / 2**20:.1f} MB besides the frame"
    finally:
        dialler.close()
        listener.close()


def test_non_blocking_sends_of_big_frames_to_a_slow_reader_arrive_whole(pair):
    """``block=False`` either sends nothing (TransportTimeout: the caller tries again) or the
    whole frame (a part out means the rest follows as the reader drains): 40 frames of
    1 MiB with an empty part and an int32 view, to a reader that takes its time."""
    listener, dialler, peer = pair
    chunk = b"y" * (1 << 20)
    tail = memoryview(array.array("i", [1, -2, 3]))
    received = []

    def drain() -> None:
        for _ in range(40):
            [(op, got)], _ = listener.recv(30)
            received.append((op, bytes(got[0]) == chunk, bytes(got[1]), bytes(got[2])))
            time.sleep(0.005)

    thread = threading.Thread(target=drain)
    thread.start()
    for _ in range(40):
        while True:
            try:
                dialler.send([(4, [chunk, b"", tail])], block=False)
                break
            except TransportTimeout:
                time.sleep(0.002)
    thread.join(60)
    assert received == [(4, True, b"", tail.tobytes())] * 40


def test_the_stream_opener_takes_the_next_frame_at_once_and_still_refuses_a_replay():
    sealer, opener = StreamSealer(b"k" * 32), StreamOpener(b"k" * 32)
    frames = [b"".join(bytes(p) for p in sealer.seal([(1, [f"m{i}".encode()])])) for i in range(5)]
    assert [bytes(opener.open(f)[0][1][0]) for f in frames[:3]] == [b"m0", b"m1", b"m2"]
    with pytest.raises(BadFrame, match="replayed"):
        opener.open(frames[1])
    assert bytes(opener.open(frames[4])[0][1][0]) == b"m4"  # out of order within the window
    assert bytes(opener.open(frames[3])[0][1][0]) == b"m3"
    with pytest.raises(BadFrame, match="replayed"):
        opener.open(frames[3])


@settings(deadline=None)
@given(st.lists(st.tuples(st.integers(0, 300), st.binary(max_size=200), st.booleans()), max_size=40))
def test_short_frames_and_counted_ones_mix_in_any_order_and_keep_the_counter(sends):
    """A private stream's one-part messages go as short frames (one byte of header, no counter);
    counted frames between them count among themselves, so the opener accepts every frame,
    in order, whichever way it opens it (``open_one`` or ``open``), and a counted one once."""
    sealer, opener = StreamSealer(b"k" * 32), StreamOpener(b"k" * 32)
    for op, payload, one in sends:
        frame = b"".join(bytes(p) for p in (sealer.seal_one(op, payload) if one else sealer.seal([(op, [payload])])))
        assert (len(frame) == 1 + len(payload)) == (one and op < 0x80), "short exactly when it can be"
        got = opener.open_one(memoryview(frame)) if one else None
        if got is None:
            (got,) = opener.open(frame)
        assert (got[0], [bytes(p) for p in got[1]]) == (op, [payload])
    last = b"".join(bytes(p) for p in sealer.seal([(1, [b"last"])]))
    assert bytes(opener.open(last)[0][1][0]) == b"last"
    with pytest.raises(BadFrame, match="replayed"):  # a counted frame after short ones: still once
        opener.open(last)


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 300), st.binary(max_size=200), st.integers(0, 2)), max_size=30),
       st.booleans())
def test_a_network_frame_of_one_message_opens_at_once_and_a_batch_is_verified_once(sends, clear):
    """Over a network (AES-GCM, or AES-GMAC without encryption) a one-part message is sealed
    without the general layout and opened by ``open_one``; a frame of several messages it
    verified is handed to ``open`` without a second verification; every frame arrives once,
    in order, and a replay is still refused."""
    from fibercore.wire.frames import ClearOpener, ClearSealer, Opener, Sealer

    key = b"n" * 32
    sealer, opener = (ClearSealer(key), ClearOpener(key)) if clear else (Sealer(key), Opener(key))
    sent = []
    for op, payload, how in sends:
        if how == 0:
            parts = sealer.seal_one(op, payload)
        elif how == 1:
            parts = sealer.seal([(op, [payload])])
        else:
            parts = sealer.seal([(op, [payload]), (op + 1, [payload[:3]])])
        frame = memoryview(bytearray(b"".join(bytes(p) for p in parts)))
        sent.append(frame)
        one = opener.open_one(frame)
        got = [one] if one is not None else opener.open(frame)
        assert [(o, [bytes(p) for p in ps]) for o, ps in got] == (
            [(op, [payload]), (op + 1, [payload[:3]])] if how == 2 else [(op, [payload])])
    for frame in sent[-3:]:
        assert opener.open_one(frame) is None
        with pytest.raises(BadFrame, match="replayed"):
            opener.open(frame)


@pytest.mark.parametrize("older", [b"FIBERv4\x00", b"FIBERv5\x00"])
def test_a_peer_of_an_earlier_protocol_is_refused_in_the_handshake(older):
    """Version 4 knew no short frames and would misread them (its counters thrown off, every
    later frame refused as a replay); version 5 knew no streamed frames (the tag last) and would
    drop the connection at the first large message: their HELLO is refused before anything
    else happens."""
    from fibercore.wire.handshake import MAGIC, Handshake, HandshakeFailed

    assert MAGIC == b"FIBERv6\x00"
    listener = Handshake(b"k" * 32, b"pair/pipe", b"i" * 16, True, "test", private=True)
    dialer = Handshake(b"k" * 32, b"pair/pipe", None, False, "test", private=True)
    hello = bytes(listener.start() or b"")
    with pytest.raises(HandshakeFailed, match="another protocol version"):
        dialer.feed(older + hello[len(MAGIC):])


def test_a_short_frame_is_one_byte_of_header_on_a_connected_pipe():
    """What a stepped simulator's message costs on the stream: its payload and five bytes (the
    record's length and the short frame's op), not a 64-byte counted header."""
    sealer = StreamSealer(b"k" * 32)
    head, body = sealer.seal_one(1, b"x" * 100)
    assert len(head) == 1 and body == b"x" * 100
    assert len(b"".join(sealer.seal([(1, [b"x" * 100])]))) == 64 + 100  # counted: as before


class _Local:
    pass


@pytest.mark.parametrize("value, plain", [
    ((np.zeros(4, dtype=np.float32), 1.0, False, False), 1),
    ({"obs": np.ones((2, 3)), "reward": np.float32(1.5), "done": np.bool_(True)}, 1),
    (("step", np.int64(1)), 1),  # gymnasium's and SB3's command to a simulator
    (("step", np.int64(1), np.float32(2)), 1),
    (("row", np.zeros(1, dtype=[("f", "i4")])[0]), 1),
    (("row", np.zeros(1, dtype=[("f", "O")])[0]), 0),  # a structured row may hold objects
    ([1, "a", b"b", None, 2.5, 3j, (1, 2)], 1),
    ((np.zeros(1024, dtype=np.float32), 1), 2),  # 4 KiB: out of band
    ([b"x" * 70_000, 1], 3),  # large bytes: out of band too
    ({"a": (b"y" * 70_000, np.zeros(1024))}, 3),
    ([bytearray(70_000), 1], 1),  # a bytearray can change: copied into the stream, as before
    (np.array([object()], dtype=object), 0),
    ((1, _Local()), 0),
    ((1, len), 0),
    ([[0] * 300], 0),  # past the walk's budget: cloudpickle takes it
    (list(range(255)), 1),  # the budget: 256 objects, the list itself counted
    (list(range(256)), 0),
    ({i: i for i in range(127)}, 1),  # keys and values counted
    ({i: i for i in range(128)}, 0),
    (((None, 1.0, False, False, {}), True), 1),  # gymnasium's answer to a step
    ((1, [2, (3, {"k": [np.float32(1), len]})]), 0),  # a function deep inside
    ((1, [2, (3, {"k": [np.float32(1), b"z" * 70_000]})]), 3),
])
def test_plain_data_is_recognised_and_nothing_else(value, plain):
    assert _plain_data(value) == plain
    s = CloudpickleSerializer()
    back = s.loads(s.dumps(value))
    if plain:
        assert repr(back) == repr(value)


@pytest.mark.parametrize("value", [
    b"b" * 200_000,
    [b"c" * 200_000, "x", (b"d" * 100_000, 3)],
    {"k": b"e" * 100_000, "n": [1, 2]},
])
def test_large_bytes_travel_out_of_band_without_a_copy_and_come_back_as_they_were(value):
    """A bytes of 64 KiB or more is sent from its own memory (the C pickler would copy it into
    the stream: a map of big items held a copy of each in the master) and comes back with its
    type and content; one object met twice is one object again."""
    s = CloudpickleSerializer()
    parts = s.dumps(value)
    assert len(parts[0]) < 1000  # the stream holds no payload
    assert all(isinstance(p, memoryview) and p.obj is not None for p in parts[1:])
    back = s.loads([parts[0], *(bytearray(p) for p in parts[1:])])
    assert back == value and repr(type(back)) == repr(type(value))
    if isinstance(value, list):
        assert type(back[0]) is bytes and type(back[2][0]) is bytes
    shared = b"s" * 100_000
    again = s.loads([(p if i == 0 else bytearray(p)) for i, p in enumerate(s.dumps([shared, shared]))])
    assert again[0] is again[1] and type(again[0]) is bytes


def test_a_bytearray_is_copied_when_pickled_so_it_may_change_and_grow_after():
    """A bytearray (mutable) is not sent from its memory: a task or message that leaves later
    carries what it held when it was pickled, and the caller may resize it meanwhile."""
    s = CloudpickleSerializer()
    ba = bytearray(b"a" * 200_000)
    parts = s.dumps([ba])
    ba[:] = b"z" * len(ba)
    ba.extend(b"more")  # no view of it is held (BufferError otherwise)
    assert s.loads(parts) == [bytearray(b"a" * 200_000)]


def test_a_big_array_in_plain_data_travels_out_of_band():
    s = CloudpickleSerializer()
    value = (np.arange(100_000, dtype=np.float64), 3)
    parts = s.dumps(value)
    assert len(parts) == 2 and memoryview(parts[1]).nbytes == 800_000
    back = s.loads([parts[0], bytearray(parts[1])])
    assert np.array_equal(back[0], value[0]) and back[1] == 3 and back[0].flags.writeable


@pytest.mark.builtin_transport  # the built-in transport's record writer
@pytest.mark.parametrize("told, given", [(5 << 20, 6 << 20), (6 << 20, 5 << 20)])
def test_pieces_that_do_not_come_to_their_announced_size_break_the_connection(told, given):
    """A :class:`Pieces` whose bytes are more or fewer than its ``len()`` is a broken frame: the
    writer stops with Broken (the connection is closed by its endpoint) instead of sending
    records whose lengths lie, or looping."""
    from fibercore.builtins.tcp.connection import Broken, Conn
    from fibercore.transport import Pieces

    class Lying(Pieces):
        def __len__(self) -> int:
            return told

        def __iter__(self):
            for _ in range(given >> 20):
                yield memoryview(bytearray(1 << 20))

    here, there = socket.socketpair()
    drained = threading.Thread(target=lambda: [None for _ in iter(lambda: there.recv(1 << 20), b"")], daemon=True)
    drained.start()
    try:
        with pytest.raises(Broken, match="announced"):
            Conn(here, None, "test").write([b"head", Lying()])  # type: ignore[arg-type]
    finally:
        here.close()
        drained.join(10)
        there.close()


@pytest.fixture
def network_pair(monkeypatch):
    """A router channel and a channel dialled to it over TCP (the network path: encrypted,
    large frames streamed), and the dialler as the listener's peer."""
    from fibercore.builtins.tcp import local as tcp_local
    from tests.helpers import connected_router

    monkeypatch.setattr(tcp_local, "LOCAL_SOCKETS", False)
    listener, dialler, peer = connected_router(get_runtime())
    assert not peer.private and peer.sealer.pieces and dialler.endpoint.peer.sealer.pieces
    yield listener, dialler, peer
    dialler.close()
    listener.close()


@pytest.mark.builtin_transport
def test_a_connected_ends_line_streams_a_large_message_over_the_network(network_pair):
    """A connected Pipe end's line (``write_two``) takes a streamed frame: a 10 MiB array sent
    through the lane arrives whole (the line once passed the pieces on as a buffer)."""
    listener, dialler, _ = network_pair
    lane = dialler.lane()
    assert lane is not None and lane._send_two is not None, "the dialled end has a line"
    big = np.arange((10 << 20) // 8, dtype=np.float64)
    sender = threading.Thread(target=lane.send, args=(5, [memoryview(big)]))
    sender.start()
    [(op, got)], _ = listener.recv(30)
    sender.join(30)
    assert op == 5 and np.array_equal(np.frombuffer(got[0], dtype=np.float64), big)


def _parser() -> Any:
    """A connection's record reader as an authenticated one reads (fed by hand with ``_parse``)."""
    from fibercore.builtins.tcp.connection import RECORD_MAX, Conn

    parser = Conn(socket.socket(), None, "parser")  # type: ignore[arg-type]
    parser.session, parser.max_record, parser.max_frame = object(), RECORD_MAX, 1 << 30  # type: ignore[assignment]
    return parser


def _slow_socket_pair(rcvbuf: int = 64 << 10) -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, rcvbuf)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    return a, b


@pytest.mark.builtin_transport
def test_non_blocking_streamed_frames_are_never_cut_and_each_opens():
    """``block=False`` writes of streamed frames to a slow reader, tried again on
    TransportTimeout (sealed anew, as the core does): the stream parses into exactly the
    frames sent, each authentic (a write that gave up in the middle of a frame would leave a
    part of one in the stream)."""
    from fibercore.builtins.tcp.connection import Conn
    from fibercore.wire.frames import Opener, Sealer

    a, b = _slow_socket_pair()
    stream = bytearray()

    def slow() -> None:
        while data := b.recv(256 << 10):
            stream.extend(data)
            time.sleep(0.001)

    reader = threading.Thread(target=slow)
    reader.start()
    sealer = Sealer(b"k" * 32)
    sealer.pieces = True
    writer = Conn(a, None, "writer")  # type: ignore[arg-type]
    sent = [bytes([i]) * ((5 << 20) + i) for i in range(4)]
    for payload in sent:
        while True:
            try:
                writer.write(sealer.seal([(1, [payload])]), block=False)
                break
            except TransportTimeout:
                time.sleep(0.0005)
    a.shutdown(socket.SHUT_WR)
    reader.join(60)
    a.close()
    b.close()
    parser = _parser()
    frames: list[bytes] = []
    parser._parse(memoryview(stream), lambda frame: frames.append(bytes(frame)))
    parser.sock.close()
    opener = Opener(b"k" * 32)
    assert [bytes(opener.open(bytearray(f))[0][1][0]) for f in frames] == sent


@pytest.mark.builtin_transport
def test_a_non_blocking_streamed_frame_to_a_reader_too_slow_for_it_gives_up_within_partial_wait(monkeypatch):
    """``block=False`` sends nothing or the whole frame within PARTIAL_WAIT, also when the frame
    is streamed piece by piece: a reader that takes 64 kB every 20 ms (at least 13 s for 40 MiB)
    makes the writer give the connection up (Broken), where it once waited per piece."""
    from fibercore.builtins.tcp import connection
    from fibercore.builtins.tcp.connection import Broken, Conn
    from fibercore.wire.frames import Sealer

    monkeypatch.setattr(connection, "PARTIAL_WAIT", 0.5)
    a, b = _slow_socket_pair()
    stop = threading.Event()

    def slow() -> None:
        while not stop.is_set():
            try:
                if not b.recv(64 << 10, socket.MSG_DONTWAIT):
                    return
            except BlockingIOError:
                pass
            except OSError:
                return
            time.sleep(0.02)

    reader = threading.Thread(target=slow)
    reader.start()
    sealer = Sealer(b"k" * 32)
    sealer.pieces = True
    try:
        with pytest.raises(Broken, match="stopped reading"):
            Conn(a, None, "writer").write(sealer.seal([(1, [b"x" * (40 << 20)])]), block=False)  # type: ignore[arg-type]
    finally:
        stop.set()
        reader.join(10)
        a.close()
        b.close()


def _vm_flags(buffer: Any) -> list[str]:
    """The kernel's flags of the mapping that holds ``buffer`` (``/proc/self/smaps``)."""
    import ctypes

    address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
    inside = False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                start, end = (int(x, 16) for x in first.split("-"))
                inside = start <= address < end
            elif inside and first == "VmFlags:":
                return line.split()[1:]
    raise AssertionError("no mapping holds the buffer")


@pytest.mark.builtin_transport
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="frames grow by mremap on Linux only")
def test_a_frame_asks_for_huge_pages_only_once_four_mib_of_it_arrived():
    """A frame's memory asks for huge pages (taken whole at their first byte) only after
    HUGE_AFTER bytes of it arrived: memory stays within what arrived plus 2 MB (half as much
    again), never 2 MB for each partial frame a peer opens with a few bytes."""
    from fibercore.builtins.tcp import connection

    parser = _parser()
    frames: list[bytes] = []
    try:
        more = struct.pack("<I", (4 << 20) | (1 << 31))
        parser._parse(memoryview(more + b"x" * 100), frames.append)
        assert "hg" not in _vm_flags(parser._partial), "a frame of 100 bytes so far asked for huge pages"
        parser._parse(memoryview(b"x" * ((4 << 20) - 100) + struct.pack("<I", 4 << 20) + b"y"), frames.append)
        assert connection.HUGE_AFTER == 4 << 20 and not frames
        if connection._HUGE is not None and os.path.exists("/sys/kernel/mm/transparent_hugepage/enabled"):
            assert "hg" in _vm_flags(parser._partial), "4 MiB arrived: the frame's memory asks for huge pages"
        parser._parse(memoryview(b"y" * ((4 << 20) - 1)), frames.append)
        assert frames == [b"x" * (4 << 20) + b"y" * (4 << 20)]
    finally:
        parser.sock.close()
