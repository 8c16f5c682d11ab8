"""Serializer and frame properties (hypothesis), and errors that name the culprit."""

from __future__ import annotations

import contextlib
import pickle
import threading

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fibercore
from fibercore.builtins.cloudpickle_serializer import CloudpickleSerializer
from fibercore.errors import SerializationError
from fibercore.wire import frames
from fibercore.wire.frames import BadFrame, Opener, Sealer

S = CloudpickleSerializer()
KEY = b"k" * 32

plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner, max_size=5)
    | st.tuples(inner, inner),
    max_leaves=20,
)


def seal(key, messages, sealer=None):
    return b"".join((sealer or Sealer(key)).seal(messages))


def unseal(key, frame):
    return Opener(key).open(frame)


def through_frame(obj):
    [(op, parts)] = unseal(KEY, seal(KEY, [(1, S.dumps(obj))]))
    return S.loads(parts)


@settings(deadline=None)  # first calls import numpy/cryptography paths; timing is not the point
@given(plain)
def test_round_trip_plain(obj):
    assert through_frame(obj) == obj


@settings(deadline=None)  # first calls import numpy/cryptography paths; timing is not the point
@given(hnp.arrays(dtype=hnp.scalar_dtypes(), shape=hnp.array_shapes(max_dims=3, max_side=40)))
def test_round_trip_numpy(arr):
    out = through_frame(arr)
    reference = pickle.loads(pickle.dumps(arr, protocol=5))  # what plain pickle delivers
    assert out.dtype in (arr.dtype, reference.dtype) and out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def _pickled_like_numpy(out, ref):
    """``out`` is what numpy's own pickle gives (``ref``): type, dtype, shape, flags, bytes."""
    assert type(out) is type(ref)
    if isinstance(ref, np.ndarray):
        assert (out.dtype, out.shape) == (ref.dtype, ref.shape)
        assert out.flags.writeable == ref.flags.writeable and out.flags.c_contiguous == ref.flags.c_contiguous
        assert out.tobytes(order="A") == ref.tobytes(order="A")
    else:
        assert out.dtype == ref.dtype and out.tobytes() == ref.tobytes()


_small_numpy = st.one_of(
    hnp.arrays(dtype=hnp.scalar_dtypes() | hnp.byte_string_dtypes() | hnp.unicode_string_dtypes()
               | hnp.nested_dtypes(max_itemsize=16) | hnp.datetime64_dtypes() | hnp.timedelta64_dtypes(),
               shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)),
    hnp.from_dtype(np.dtype("f8")).map(np.float64), hnp.from_dtype(np.dtype("i8")).map(np.int64),
    hnp.from_dtype(np.dtype(">u2")).map(lambda v: np.array(v, dtype=">u2")[()]),
    st.booleans().map(np.bool_), hnp.from_dtype(np.dtype("c8")).map(np.complex64),
    hnp.from_dtype(np.dtype("M8[s]")).map(np.datetime64),
)


@settings(deadline=None)  # first calls import numpy paths; timing is not the point
@given(st.lists(_small_numpy, min_size=1, max_size=4), st.sampled_from(["c", "f", "strided", "readonly"]))
def test_small_numpy_objects_come_back_exactly_as_numpys_own_pickle_gives_them(items, layout):
    """Plain data with small numpy objects (an RL step's action and observation) is pickled
    with one global per numpy object (fibercore.builtins.numpy_pickling); what arrives is
    what ``pickle`` of numpy gives: type, dtype, byte order, shape, writability, bytes; a
    layout it does not take (Fortran order, strided, structured) is numpy's own pickle."""
    def laid_out(x):
        if not isinstance(x, np.ndarray) or x.ndim < 2:
            return x
        if layout == "f":
            return np.asfortranarray(x)
        if layout == "strided":
            return x[:, ::2]
        if layout == "readonly":
            x = x.copy()
            x.flags.writeable = False
        return x

    value = ("step", *map(laid_out, items), 1.5)
    parts = S.dumps(value)
    assert len(parts) == 1  # small: nothing out of band
    back = S.loads(parts)
    reference = pickle.loads(pickle.dumps(value, protocol=5))
    assert back[0] == "step" and back[-1] == 1.5 and len(back) == len(value)
    for out, ref in zip(back[1:-1], reference[1:-1], strict=True):
        _pickled_like_numpy(out, ref)


def test_every_numpy_scalar_type_comes_back_as_numpys_own_pickle_gives_it():
    """Each numpy scalar type (float16 to clongdouble, longlong, dates in several units) sent in
    a small message arrives as numpy's own pickle gives it: the reducer kept per type for
    numbers and booleans names the type's dtype once, for every value of the type."""
    kinds = {k for k in np.sctypeDict.values() if isinstance(k, type) and issubclass(k, np.generic)}
    values = [k(1) for k in kinds if np.dtype(k).kind in "biufc"]
    values += [np.datetime64("2020-01-02", unit) for unit in ("D", "s", "ns")]
    values += [np.timedelta64(5, unit) for unit in ("ms", "h")]
    for value in values:
        message = ("step", value, -value if np.dtype(type(value)).kind in "ifcm" else value)
        back = S.loads(S.dumps(message))
        reference = pickle.loads(pickle.dumps(message, protocol=5))
        for out, ref in zip(back[1:], reference[1:], strict=True):
            _pickled_like_numpy(out, ref)


def test_an_rl_step_pickles_with_one_global_per_numpy_object():
    """``("step", np.int64(1))`` and ``(obs, reward, terminated, truncated)`` carry one global
    each for their numpy objects (numpy's own pickle: two, each an import look-up)."""
    import pickletools

    def globals_in(data):
        return sum(op.name in ("GLOBAL", "STACK_GLOBAL") for op, _arg, _pos in pickletools.genops(data))

    action = ("step", np.int64(1))
    step = (np.zeros(4, dtype=np.float32), 1.0, np.bool_(False), False)
    assert globals_in(S.dumps(action)[0]) == 1 < globals_in(pickle.dumps(action, protocol=5))
    assert globals_in(S.dumps(step)[0]) == 2 < globals_in(pickle.dumps(step, protocol=5))
    assert repr(S.loads(S.dumps(step))) == repr(step)


def test_a_dump_re_entered_on_its_thread_takes_a_pickler_of_its_own():
    """A message pickled while this thread's pickler is busy (a signal handler that sends in
    the middle of a dump) does not share its pickler or buffer."""
    from fibercore.builtins import numpy_pickling

    first = numpy_pickling.dumps(("a", np.int64(1)))
    numpy_pickling._reused.busy = True
    try:
        inner = numpy_pickling.dumps(("b", np.float32(2)))
    finally:
        numpy_pickling._reused.busy = False
    assert pickle.loads(inner) == ("b", np.float32(2)) and pickle.loads(first) == ("a", np.int64(1))
    out = numpy_pickling._reused.out
    assert out is not None and out.getvalue() == b""  # the thread's buffer: untouched, and empty


def test_the_reused_pickler_keeps_nothing_of_a_message_once_it_is_pickled():
    """Neither the objects (the pickler's memo) nor the bytes (its buffer) of a message stay
    with the thread: an array sent is freed when its sender drops it, memory under it can
    be resized, a large string in the message is not held."""
    import gc
    import weakref

    from fibercore.builtins import numpy_pickling

    a = np.zeros(4, np.float32)
    gone = weakref.ref(a)
    S.dumps((a, 1.0, False, False))
    del a
    gc.collect()
    assert gone() is None
    under = bytearray(16)
    S.dumps(("obs", np.frombuffer(under, np.uint8)))
    gc.collect()
    under.extend(b"x")  # BufferError while a view of it is exported
    S.dumps(("result", np.int64(1), "x" * 1_000_000))
    out = numpy_pickling._reused.out
    assert out is not None and out.getvalue() == b"" and len(out.getbuffer()) == 0


@pytest.mark.parametrize("plain_first", [True, False])
def test_dtype_metadata_travels_whichever_dtype_was_pickled_first(plain_first):
    """A dtype with metadata equals (and hashes as) the one without: the code-string cache
    must not give one the other's answer."""
    tagged = np.zeros(3, np.dtype("f8", metadata={"unit": "m"}))
    plain = np.zeros(3)
    order = [plain, tagged] if plain_first else [tagged, plain]
    for arr in order:
        back = S.loads(S.dumps(("obs", arr)))[1]
        assert back.dtype.metadata == arr.dtype.metadata
    from fibercore.builtins import numpy_pickling

    assert numpy_pickling._code(plain.dtype) == "<f8"  # the fast path stays on for plain float64


def test_the_serializer_neither_needs_nor_imports_numpy():
    """numpy is optional: the serializer imports without it and pickles plain data, and where
    it is installed it is not imported for data without numpy objects."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['numpy'] = None\n"
            "from fibercore.builtins.cloudpickle_serializer import CloudpickleSerializer as C\n"
            "s = C(); assert s.loads(s.dumps(('a', 1, [2.5]))) == ('a', 1, [2.5])\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    code = ("import sys\n"
            "from fibercore.builtins.cloudpickle_serializer import CloudpickleSerializer as C\n"
            "s = C(); s.loads(s.dumps(('a', 1))); assert 'numpy' not in sys.modules, 'numpy imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_large_array_travels_out_of_band_and_stays_writable():
    arr = np.arange(1_000_000, dtype=np.float64)
    parts = S.dumps(arr)
    assert len(parts) == 2 and len(parts[0]) < 1000  # the data is not in the pickle stream
    out = through_frame(arr)
    out += 1
    assert out[0] == 1.0


@settings(deadline=None)  # first calls import numpy/cryptography paths; timing is not the point
@given(st.integers(), st.integers())
def test_round_trip_lambdas_and_closures(a, b):
    f = lambda x: x * a + b  # noqa: E731
    assert through_frame(f)(3) == 3 * a + b


@settings(deadline=None)  # first calls import numpy/cryptography paths; timing is not the point
@given(st.lists(st.lists(st.binary(max_size=50), max_size=4), max_size=20))
def test_frames_round_trip_many_messages(messages):
    msgs = [(i % 250 + 1, parts) for i, parts in enumerate(messages)]
    out = unseal(KEY, seal(KEY, msgs))
    assert [(op, [bytes(p) for p in parts]) for op, parts in out] == msgs


@settings(deadline=None)
@given(st.lists(st.binary(max_size=30), max_size=60), st.lists(st.binary(max_size=30), min_size=2, max_size=7))
def test_frames_round_trip_batches_of_one_part_messages_and_a_message_of_many_parts(batch, many):
    msgs = [(i % 250 + 1, [part]) for i, part in enumerate(batch)]  # a sender's burst
    assert [(op, [bytes(p) for p in parts]) for op, parts in unseal(KEY, seal(KEY, msgs))] == msgs
    [(op, parts)] = unseal(KEY, seal(KEY, [(7, many)]))  # a request of a few parts
    assert op == 7 and [bytes(p) for p in parts] == many


_part = st.one_of(
    st.binary(max_size=40),  # a small pickle: joined with its neighbours into one payload part
    st.sampled_from([8192, 20000]).map(lambda n: b"b" * n),  # at or over the joining limit: sent as it is
    st.binary(min_size=1, max_size=10).map(lambda b: memoryview(b * 4).cast("I")),  # words: nbytes != len
    st.binary(max_size=40).map(bytearray),
)


@settings(deadline=None)
@given(st.lists(st.lists(_part, max_size=2), max_size=30), st.booleans())
def test_frames_of_many_messages_round_trip_whatever_parts_they_carry(messages, stream):
    """A frame of many messages joins small pickles into one payload part; messages of no
    part (a queue's DONE), of several, of buffers that are not bytes, and big pickles keep
    their sizes and order, with either sealer."""
    from fibercore.wire.frames import StreamOpener, StreamSealer

    msgs = [(i % 250 + 1, parts) for i, parts in enumerate(messages)]
    sealer, opener = (StreamSealer(KEY), StreamOpener(KEY)) if stream else (Sealer(KEY), Opener(KEY))
    out = opener.open(b"".join(bytes(p) for p in sealer.seal(msgs)))
    assert [(op, [bytes(p) for p in parts]) for op, parts in out] == [
        (op, [bytes(p) for p in parts]) for op, parts in msgs]


def test_a_grant_of_small_pickles_is_written_as_one_payload_part():
    """A queue's grant of 500 items and its DONE: the stream sealer gives tag, words and one
    joined payload (a part per item cost the writer a few calls of Python each)."""
    from fibercore.wire.frames import StreamOpener, StreamSealer

    msgs = [(3, [b"%d" % i * 10]) for i in range(500)] + [(17, [])]
    frame = StreamSealer(KEY).seal(msgs)
    assert len(frame) == 3
    out = StreamOpener(KEY).open(b"".join(bytes(p) for p in frame))
    assert [(op, [bytes(p) for p in parts]) for op, parts in out] == msgs


@given(st.lists(st.integers(0, 20), min_size=1, max_size=6), st.integers(-3, 3).filter(bool), st.booleans())
def test_an_authentic_header_that_does_not_match_its_payload_is_refused(sizes, off, batch):
    """What a peer holding the key could still send wrong: sizes that do not add up to the
    payload (each of _split's shortcuts must refuse it as its general loop does)."""
    from fibercore.wire.frames import _split

    words = [0, 0, 0]
    if batch:  # one-part messages
        for i, size in enumerate(sizes):
            words += [i + 1, 1, size]
        words[2] = len(sizes)
    else:  # one message of several parts
        words += [1, len(sizes), *sizes]
        words[2] = 1
    words[1] = len(words)
    assume(sum(sizes) + off >= 0)
    payload = bytes(sum(sizes) + off)
    body = memoryview(b"".join(w.to_bytes(8, "little") for w in words) + payload)
    with pytest.raises(BadFrame):
        _split(body)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_never_unseals(data):
    with pytest.raises(BadFrame):
        unseal(KEY, data)


@settings(deadline=None)  # first calls import numpy/cryptography paths; timing is not the point
@given(st.binary(min_size=1, max_size=100), st.integers(min_value=0))
def test_any_bit_flip_is_detected(payload, pos):
    frame = bytearray(seal(KEY, [(1, [payload])]))
    i = pos % len(frame)
    frame[i] ^= 0x01
    with pytest.raises(BadFrame):
        unseal(KEY, bytes(frame))


def test_replayed_and_reordered_frames():
    sealer, opener = Sealer(KEY), Opener(KEY)
    frames = [seal(KEY, [(1, [bytes([i])])], sealer) for i in range(100)]
    assert opener.open(frames[1])[0][1][0] == b"\x01"
    assert opener.open(frames[0])[0][1][0] == b"\x00"  # late (another thread verified first): once
    for frame in frames[:2]:
        with pytest.raises(BadFrame, match="replayed"):
            opener.open(frame)
    assert opener.open(frames[99])[0][1][0] == b"c"
    with pytest.raises(BadFrame, match="replayed"):  # beyond the window: never again
        opener.open(frames[5])


def test_large_frame_round_trip_streams_the_tag():
    payload = np.arange(200_000, dtype=np.float64)
    [(op, parts)] = unseal(KEY, seal(KEY, [(3, [b"head", memoryview(payload)])]))
    assert op == 3 and bytes(parts[0]) == b"head"
    np.testing.assert_array_equal(np.frombuffer(parts[1], dtype=np.float64), payload)


def streamed(sealer, messages):
    """A streamed frame as the transport sends it: the parts, then each piece copied before
    the next is made (the pieces share one buffer)."""
    *whole, pieces = sealer.seal(messages)
    assert isinstance(pieces, frames.Pieces)
    out = b"".join(bytes(p) for p in whole) + b"".join(bytes(p) for p in pieces)
    assert len(out) == sum(map(len, whole)) + len(pieces)
    return out


@contextlib.contextmanager
def small_streams(stream_min, piece):
    """Streamed frames from ``stream_min`` bytes on, in pieces of ``piece`` (the sizes that
    matter, without megabytes per example)."""
    saved = frames.STREAM_MIN, frames._PIECE, frames._ONE_SHOT_MAX
    frames.STREAM_MIN, frames._PIECE, frames._ONE_SHOT_MAX = stream_min, piece, min(stream_min, saved[2])
    try:
        yield
    finally:
        frames.STREAM_MIN, frames._PIECE, frames._ONE_SHOT_MAX = saved


@settings(deadline=None, max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 300), st.lists(st.binary(max_size=700), max_size=4)), min_size=1,
                max_size=4),
       st.integers(64, 400), st.integers(16, 300), st.booleans(), st.data())
def test_a_streamed_frame_round_trips_is_encrypted_and_refused_when_changed(messages, stream_min, piece, clear,
                                                                             data):
    """A large frame on a transport that takes Pieces is sealed piece by piece with its tag
    last: it opens into the messages sealed, in order, whatever its size against the pieces';
    nothing of the payload is in clear (unless the program chose network_encryption=False);
    a flipped bit anywhere, a frame cut short or a streamed frame's leading zeros changed
    fail; a replay is refused."""
    from fibercore.wire.frames import ClearOpener, ClearSealer

    sealer, opener = (ClearSealer(KEY), ClearOpener(KEY)) if clear else (Sealer(KEY), Opener(KEY))
    sealer.pieces = True
    with small_streams(stream_min, piece):
        sent = [(op, [b"SECRET" + p for p in parts]) for op, parts in messages]
        size = sum(len(p) for _, parts in sent for p in parts)
        if size <= stream_min:  # small frames are sealed whole, as before
            assert not any(isinstance(p, frames.Pieces) for p in sealer.seal(sent))
            return
        frame = streamed(sealer, sent)
        assert frame[:16] == bytes(16) and (b"SECRET" in frame) == clear
        got = opener.open(bytearray(frame))
        assert [(op, [bytes(p) for p in ps]) for op, ps in got] == sent
        with pytest.raises(BadFrame, match="replayed"):
            opener.open(bytearray(frame))
        fresh = ClearOpener(KEY) if clear else Opener(KEY)
        broken = bytearray(frame)
        broken[data.draw(st.integers(0, len(frame) - 1))] ^= 1 << data.draw(st.integers(0, 7))
        with pytest.raises(BadFrame):
            fresh.open(broken)
        with pytest.raises(BadFrame):
            fresh.open(bytearray(frame[:data.draw(st.integers(0, len(frame) - 1))]))


@pytest.mark.parametrize("clear", [False, True])
def test_a_tag_first_frame_with_its_tag_zeroed_is_refused(clear):
    """A frame's leading zeros say "the tag is last": zeroing a large tag-first frame's tag
    (an attacker's try to make the receiver look elsewhere) fails authentication."""
    from fibercore.wire.frames import ClearOpener, ClearSealer

    sealer, opener = (ClearSealer(KEY), ClearOpener(KEY)) if clear else (Sealer(KEY), Opener(KEY))
    frame = bytearray(b"".join(bytes(p) for p in sealer.seal([(1, [b"x" * (frames.STREAM_MIN + 100)])])))
    assert frame[:16] != bytes(16)
    frame[:16] = bytes(16)
    with pytest.raises(BadFrame):
        opener.open(frame)


@settings(deadline=None)
@given(st.sampled_from([100, 70_000, 300_000]), st.integers(min_value=0))
def test_network_frames_are_encrypted_and_any_flip_in_a_big_one_is_detected(size, pos):
    """The payload never appears in a sealed frame (small frames and streamed big ones), and
    what comes out is writable; a flipped bit anywhere fails."""
    payload = (b"SECRET-PAYLOAD-" * (size // 15 + 1))[:size]
    frame = seal(KEY, [(1, [b"head", payload])])
    assert b"SECRET-PAYLOAD" not in frame
    [(op, parts)] = unseal(KEY, frame)
    assert bytes(parts[1]) == payload and not parts[1].readonly
    broken = bytearray(frame)
    broken[pos % len(broken)] ^= 0x80
    with pytest.raises(BadFrame):
        unseal(KEY, bytes(broken))


@settings(deadline=None, max_examples=40)
@given(st.sampled_from([70_000, (1 << 20) - 900, 1 << 20, (1 << 20) + 100, (2 << 20) + 1030, 3 << 20]),
       st.integers(min_value=0))
def test_a_big_frame_in_writable_memory_is_opened_in_place_and_any_flip_is_detected(size, pos):
    """A frame read from a socket is writable: a big one is decrypted over itself (no second
    copy of it in new memory), step by step and its last bytes apart; what comes out is the
    payload, in the frame's own memory; a flipped bit anywhere fails."""
    payload = bytes(range(256)) * (size // 256 + 1)
    payload = payload[:size]
    frame = bytearray(seal(KEY, [(1, [b"head", payload])]))
    [(op, parts)] = Opener(KEY).open(memoryview(frame))
    assert op == 1 and bytes(parts[0]) == b"head" and bytes(parts[1]) == payload
    assert parts[1].obj is frame  # in place: a view of the frame, not a new buffer
    broken = bytearray(seal(KEY, [(1, [b"head", payload])]))
    broken[pos % len(broken)] ^= 0x04
    with pytest.raises(BadFrame):
        Opener(KEY).open(memoryview(broken))


def test_wrong_key_is_rejected():
    frame = seal(KEY, [(1, [b"x"])])
    with pytest.raises(BadFrame):
        unseal(b"z" * 32, frame)


def test_unpicklable_argument_is_named():
    lock = threading.Lock()
    p = fibercore.Process(target=print, args=(1, lock))
    with pytest.raises(SerializationError) as info:
        p.start()
    msg = str(info.value)
    assert "argument 1" in msg and "lock" in msg.lower() and p.name in msg


def test_unpicklable_queue_item_is_named(capsys):
    """As multiprocessing's feeder: put() does not raise, the error (naming the item and
    the fix) is printed, the item is dropped and the queue keeps working."""
    q = fibercore.Queue()
    q.put(threading.Lock())
    q.put("next")
    assert q.get(timeout=10) == "next"
    err = capsys.readouterr().err
    assert "SerializationError" in err and "through a Queue" in err and "lock" in err


def test_fiber_serializer_hook_resolved_once():
    rt = fibercore.get_runtime()
    assert rt.serializer is rt.serializer and rt.serializer.name == "cloudpickle"


# -- network_encryption=False: frames authenticated (AES-GMAC), not encrypted -----------------


@settings(deadline=None)
@given(st.lists(st.lists(_part, max_size=2), max_size=30), st.sampled_from([0, 70_000, 300_000]))
def test_clear_frames_round_trip_and_carry_the_payload_in_clear(messages, big):
    """Small frames (one GMAC call) and large ones (streamed) round-trip; the payload is in the
    frame as sent (nothing encrypted)."""
    from fibercore.wire.frames import ClearOpener, ClearSealer

    msgs = [(i % 250 + 1, parts) for i, parts in enumerate(messages)] + ([(9, [b"z" * big])] if big else [])
    frame = b"".join(bytes(p) for p in ClearSealer(KEY).seal(msgs))
    if big:
        assert b"z" * big in frame
    out = ClearOpener(KEY).open(frame)
    assert [(op, [bytes(p) for p in parts]) for op, parts in out] == [
        (op, [bytes(p) for p in parts]) for op, parts in msgs]


@settings(deadline=None)
@given(st.binary(min_size=1, max_size=200), st.sampled_from([100, 200_000]), st.data())
def test_a_clear_frame_changed_anywhere_replayed_or_under_another_key_is_refused(payload, size, data):
    from fibercore.wire.frames import ClearOpener, ClearSealer

    sealer, opener = ClearSealer(KEY), ClearOpener(KEY)
    frame = bytearray(b"".join(bytes(p) for p in sealer.seal([(5, [payload * (size // len(payload) + 1)])])))
    where = data.draw(st.integers(0, len(frame) - 1))
    changed = bytearray(frame)
    changed[where] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(BadFrame):
        opener.open(bytes(changed))
    with pytest.raises(BadFrame):
        ClearOpener(b"j" * 32).open(bytes(frame))  # another connection's (direction's) key
    with pytest.raises(BadFrame):  # an encrypted frame's opener does not take it either
        Opener(KEY).open(bytes(frame))
    opener.open(bytes(frame))
    with pytest.raises(BadFrame, match="replayed"):
        opener.open(bytes(frame))
