"""Pipe: the multiprocessing Connection API, order, EOF, bytes, poll."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fibercore as mp
from tests.helpers import (
    array_roundtrip,
    count_changed,
    pipe_bytes_echo,
    pipe_collect,
    pipe_count_to_eof,
    pipe_lane_behaviour,
    pipe_line_echo,
    pipe_send_all,
    pipe_send_paced,
    pipe_send_sleep_send,
)


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


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.tuples(st.one_of(st.integers(), st.binary(max_size=70_000)), st.booleans()), max_size=300))
def test_order_preserved_when_sends_alternate_between_bursts_and_an_idle_line(items):
    """An idle line sends a message in one step, a burst goes through the sender thread in
    batches; a mix of both, both ways, arrives in order (big items force partial writes)."""
    a, b = mp.Pipe()
    p = mp.Process(target=pipe_send_paced, args=(b, items))
    p.start()
    b.close()
    got = [a.recv() for _ in items]
    p.join(30)
    assert got == [item for item, _ in items]
    c, d = mp.Pipe()  # the other direction: this process sends, the child collects
    q = mp.Process(target=pipe_collect, args=(d, len(items)))
    q.start()
    for item, pause in items:
        c.send(item)
        if pause:
            time.sleep(0.0005)
    assert c.recv() == [item for item, _ in items]
    q.join(30)


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


@pytest.mark.parametrize("kind", ["array", "bytearray"])
def test_a_buffer_changed_right_after_send_arrives_as_it_was_sent(kind):
    """As after multiprocessing's send(), which pickles in the call: 200 buffers of 1.6 MB
    sent back to back (a burst: the end's sender thread writes them after send() returned)
    and each overwritten at once; the child finds every one as it was sent (3 of 200 arrived
    changed when queued messages kept views of the caller's memory)."""
    a, b = mp.Pipe()
    p = mp.Process(target=count_changed, args=(b, b, 200))
    p.start()
    for _ in range(200):
        buf = np.ones(200_000) if kind == "array" else bytearray(b"\1" * 1_600_000)
        a.send(buf)
        buf[:] = np.zeros(200_000) if kind == "array" else bytearray(1_600_000)
    assert a.recv() == 0
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


def test_wait_sleeps_on_children_sockets_and_sentinels_and_wakes_for_each():
    """wait() as multiprocessing's: connections whose other end is in a job, a socket and a
    process sentinel in one call; it uses no CPU while nothing is ready, wakes within a few
    milliseconds of a message, and returns every ready object."""
    import resource
    import socket

    from fibercore.connection import wait
    from tests.helpers import pipe_hello_sleep_bye

    ends, procs = [], []
    for i in range(3):
        a, b = mp.Pipe()
        p = mp.Process(target=pipe_hello_sleep_bye, args=(b, i, 0.6 + 1.0 * i))
        p.start()
        b.close()
        ends.append(a)
        procs.append(p)
    hellos = [a.recv() for a in ends]
    assert [h[:2] for h in hellos] == [("hello", 0), ("hello", 1), ("hello", 2)]
    s1, s2 = socket.socketpair()
    try:
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        ready = wait([*ends, s1], timeout=30)
        returned = time.monotonic()
        waited = returned - t0
        cpu = resource.getrusage(resource.RUSAGE_SELF)
        # The first child says bye 0.6 s after its hello (the clock is the machine's, shared):
        # wait() returned for that, not before it (how long it slept depends on when the
        # hellos were read, which a loaded machine delays).
        assert ready == [ends[0]] and hellos[0][2] + 0.6 <= returned and waited < 5, (ready, waited)
        used = (cpu.ru_utime - cpu0.ru_utime) + (cpu.ru_stime - cpu0.ru_stime)
        assert used < 0.03 * waited + 0.02, f"wait() used {used:.3f} s of CPU in {waited:.2f} s"
        assert ends[0].recv() == ("bye", 0)
        s2.send(b"x")
        assert set(wait([*ends, s1], timeout=30)) >= {s1}
        assert wait([ends[1], ends[2]], timeout=30)
        sentinels = {p.sentinel for p in procs}
        for p in procs:
            p.join(30)
        seen: set[int] = set()
        deadline = time.monotonic() + 5
        while seen != sentinels and time.monotonic() < deadline:
            seen.update(wait(list(sentinels - seen), timeout=5))
        assert seen == sentinels
        assert wait([ends[0]], timeout=5) == [ends[0]]  # at the end of the pipe: readable
        with pytest.raises(EOFError):
            ends[0].recv()
        t0 = time.monotonic()
        assert wait([s2], timeout=0.2) == [] and time.monotonic() - t0 >= 0.19
    finally:
        s1.close()
        s2.close()


_SPIN_SCRIPT = """
import time
import fibercore as mp
from tests.helpers import pipe_echo_n

if __name__ == "__main__":
    a, b = mp.Pipe()
    p = mp.Process(target=pipe_echo_n, args=(b, 200))
    p.start()
    for i in range(200):
        a.send_bytes(i.to_bytes(4, "little"))
        assert a.recv_bytes() == i.to_bytes(4, "little")
    t0 = time.monotonic()
    assert not a.poll(0.2)  # a waiting read that spins first still honours its timeout
    waited = time.monotonic() - t0
    assert 0.15 < waited < 2.0, waited
    a.send_bytes(b"bye")
    p.join(30)
    assert p.exitcode == 0
    print("ok")
"""


@pytest.mark.parametrize("spin_us", ["0", "50", "5000"])
def test_round_trips_and_timeouts_with_any_spin_wait(tmp_path, spin_us):
    """``spin_wait`` (microseconds a waiting read polls before it sleeps) changes speed only:
    without it the read blocks in the kernel at once, with a long one it polls first."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "spin.py"
    script.write_text(_SPIN_SCRIPT)
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "FIBER_SPIN_WAIT": spin_us, "PYTHONPATH": str(root)}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"


def test_a_second_writer_is_heard_while_the_first_is_silent():
    """The home end reads its one peer's socket directly (its lane); a second process using
    the other end wakes it, so its message does not wait for the silent first one."""
    r, w = mp.Pipe(duplex=False)
    first = mp.Process(target=pipe_send_sleep_send, args=(w, "first", 5.0, "first again"))
    first.start()
    assert r.recv() == "first"
    second = mp.Process(target=pipe_send_sleep_send, args=(w, "second", 0.0, "second again"))
    t0 = time.monotonic()
    second.start()
    assert r.recv() == "second" and r.recv() == "second again"
    assert time.monotonic() - t0 < 4.0
    assert r.recv() == "first again"
    first.join(30)
    second.join(30)


def test_an_answer_is_sent_at_once_not_batched_as_part_of_a_burst():
    """A message sent right after one was received answers it: it leaves on the caller's
    thread however quick the exchange (a burst of sends, with nothing received between them,
    is what the sending thread batches). 3,000 round trips between two ends of this process
    queue nothing for a sending thread on either."""
    import pickle

    a, home_b = mp.Pipe()
    b = pickle.loads(pickle.dumps(home_b))  # a dialled copy, as a child's end is
    home_b.close()
    b.send_bytes(b"hello")
    assert a.recv_bytes() == b"hello"
    a.send_bytes(b"warm")  # the first send may wait for the home to see its peer (queued)
    b.send_bytes(b.recv_bytes())
    assert a.recv_bytes() == b"warm"
    before = [end._network.sender.queued for end in (a, b)]
    for i in range(3000):
        a.send_bytes(b"%d" % i)
        b.send_bytes(b.recv_bytes())
        assert a.recv_bytes() == b"%d" % i
    assert [end._network.sender.queued for end in (a, b)] == before, "a reply was queued for the sending thread"
    a.close()
    b.close()


def test_a_connected_end_steps_on_its_line_and_drops_it_where_it_must():
    """Once connected to its one peer, each end sends and reads on its line; a forked copy,
    an end whose fileno() was used and a closed end have none, and messages keep coming."""
    import os

    a, b = mp.Pipe()
    p = mp.Process(target=pipe_line_echo, args=(b,))
    p.start()
    b.close()
    for i in range(50):
        a.send(i)
        assert a.recv() == i
    from fibercore.transport import LaneEndpoint

    if not isinstance(a._network.channel.endpoint, LaneEndpoint):
        a.send(None)
        p.join(30)
        pytest.skip("this transport offers no lane (fiber-nng): a Pipe end has no line")
    assert a._network.line is not None, "the master's end reads and sends on its line"
    a.send("line?")
    assert a.recv() is True, "so does the child's"
    pid = os.fork()
    if pid == 0:  # the sockets are the parent's: the copy must not use them directly
        os._exit(0 if a._network.line is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0, "a forked copy of the end has no line"
    assert a._network.line is not None, "the parent keeps its own"
    a.fileno()  # from now on a thread receives for this end
    assert a._network.line is None
    for i in range(20):
        a.send(i)
        assert a.recv() == i
    a.send(None)
    p.join(30)
    assert p.exitcode == 0
    a.close()
    assert a._network.line is None


def test_a_child_end_polls_receives_sends_bursts_and_sees_eof_through_its_lane():
    a, b = mp.Pipe()
    p = mp.Process(target=pipe_lane_behaviour, args=(b,))
    p.start()
    b.close()
    tag, polled, waited = a.recv()
    assert (tag, polled) == ("polled", False) and 0.25 <= waited < 2.0
    a.send(5000)
    assert [a.recv() for _ in range(5000)] == list(range(5000))
    a.close()
    p.join(30)
    assert p.exitcode == 0


def test_a_child_end_keeps_sending_while_the_reader_stops_and_nothing_is_lost():
    """With the reader stopped, a child's sends fill the socket's buffers, then queue in its
    sender (bursts are batched there); everything arrives, in order, once the reader reads."""
    a, b = mp.Pipe()
    p = mp.Process(target=pipe_send_all, args=(b, [bytes(64 << 10)] * 200 + [b"end"]))
    p.start()
    b.close()
    time.sleep(1.0)  # the child fills the buffers and blocks
    got = [a.recv() for _ in range(201)]
    assert got[-1] == b"end" and all(len(x) == 64 << 10 for x in got[:-1])
    p.join(30)
    assert p.exitcode == 0


@pytest.mark.parametrize("how", ["recv", "wait", "poll"])
def test_a_killed_childs_end_reads_eof_while_the_creator_waits(how):
    """No word from a SIGKILLed child (no CLOSE frame): the creator, already waiting, still
    learns at once that the other end is gone (its reader is woken, not left to time out)."""
    import os
    import signal
    import threading

    from fibercore.connection import wait

    a, b = mp.Pipe()
    child = mp.Process(target=pipe_collect, args=(b, 2))
    child.start()
    b.close()
    a.send(1)
    threading.Timer(0.5, os.kill, (child.pid, signal.SIGKILL)).start()
    started = time.monotonic()
    if how == "recv":
        with pytest.raises(EOFError):
            a.recv()
    elif how == "wait":
        assert wait([a], 20) == [a]
    else:
        assert a.poll(20)
    assert time.monotonic() - started < 5
    child.join(10)


def test_an_end_dropped_without_close_lets_go_and_what_it_sent_still_arrives():
    """Programs that forget close(): as multiprocessing's, a dropped end is collected. Its
    sending thread and socket go (and the pipe's listener with the pipe's last end), a burst
    sent just before still arrives in full, and the reader then sees the end of the pipe."""
    import gc
    import threading

    from fibercore.pipes.home import homes

    results = mp.Queue()
    made = []
    for delay, item, count in ((0.0, 0, 2000), (0.0, 0, 2000), (1.5, bytes(64 << 10), 200)):
        a, b = mp.Pipe()
        made.append(a._pipe_id)
        p = mp.Process(target=pipe_count_to_eof, args=(b, results, delay))
        p.start()
        del b  # a copy went to the child; this one is dropped unclosed
        for _ in range(count):
            a.send(item)  # a burst: queued in the end's sender (the last round: past the socket's buffers)
        del a  # dropped unclosed while its sender still has the burst to send
        assert results.get(timeout=60) == count
        p.join(30)
        assert p.exitcode == 0
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
            any(t.name.startswith("fiber-pipe") for t in threading.enumerate()) or set(made) & set(homes)):
        time.sleep(0.05)
    assert not [t.name for t in threading.enumerate() if t.name.startswith("fiber-pipe")]
    assert not set(made) & set(homes), "a pipe's listener outlived both its ends"


def test_copies_of_an_end_made_in_the_creator_do_not_close_the_pipe():
    """An end rebuilt in its creator (pickled and loaded there, as a queue or a library may do)
    is a third object on the pipe: closing or dropping it leaves the pipe as it was."""
    import gc
    import pickle

    a, b = mp.Pipe()
    for word in ("one", "two", "three"):
        copy = pickle.loads(pickle.dumps(b))
        copy.send(word)
        assert a.recv() == word
        copy.close() if word != "two" else None
        del copy  # "two": dropped unclosed
        gc.collect()
    assert not a.poll(0.2), "the other end was counted closed"
    b.send("original")
    assert a.recv() == "original"
    a.close()
    b.close()
