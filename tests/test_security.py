"""Forged and garbage frames to every listening endpoint: nothing is unpickled, all keeps serving."""

from __future__ import annotations

import os
import pickle
import time

import pynng

import fibercore as mp
from fibercore import admin, wire
from fibercore.connection import _homes
from fibercore.queues import _brokers
from tests.helpers import sleep_then_put

CANARY = f"/tmp/fibercore-pwned-{os.getpid()}"


class Exploit:
    def __reduce__(self):
        return (os.system, (f"touch {CANARY}",))


def forged_frames():
    evil = pickle.dumps(Exploit())
    wrong_key = b"w" * 32
    return [
        b"",
        b"garbage" * 10,
        evil,  # a bare pickle
        os.urandom(200),
        wire.seal(wrong_key, [(1, [evil])]),  # well-formed, wrong secret
        wire.seal(wrong_key, [(admin.HELLO, [b"token", b"1", b"host"])]),
        b"\x00" * 32 + evil,  # zero tag
    ]


def attack(address: str, kind: str) -> None:
    sock = pynng.Pair1() if kind == "router" else pynng.Pair0()
    sock.send_timeout = 1000
    sock.dial(address, block=True)
    for frame in forged_frames():
        try:
            sock.send(frame)
        except pynng.NNGException:
            pass
    time.sleep(0.3)
    sock.close()


def test_forged_frames_on_every_endpoint_are_dropped_and_master_keeps_serving():
    if os.path.exists(CANARY):
        os.remove(CANARY)
    q = mp.Queue()
    a, b = mp.Pipe()
    p = mp.Process(target=sleep_then_put, args=(q, 0.5))
    p.start()  # the admin hub now listens too
    before = wire.stats["rejected_frames"]
    attack(admin.get_hub().address, "router")
    for broker in list(_brokers.values()):
        attack(broker.address, "router")
    attack(_homes[a._pipe_id].address, "pair")
    assert not os.path.exists(CANARY), "a forged frame was unpickled"
    assert wire.stats["rejected_frames"] - before >= 2 * len(forged_frames())
    # Everything still works after the attack.
    assert q.get(timeout=30) == p.pid
    p.join(30)
    assert p.exitcode == 0
    q.put("still serving")
    assert q.get(timeout=5) == "still serving"
    p2 = mp.Process(target=sleep_then_put, args=(q, 0))
    p2.start()
    assert q.get(timeout=30) == p2.pid
    p2.join(30)


def test_listeners_bind_loopback_only_for_local_backend():
    q = mp.Queue()
    assert mp.get_runtime().listen_host == "127.0.0.1"
    assert _brokers[q._qid].address.startswith("tcp://127.0.0.1:")


def test_secret_is_not_in_job_spec_env_or_repr():
    seen = []

    class Spy:
        @mp.hookimpl
        def fiber_job_started(self, job, spec):
            seen.append((dict(spec.env), repr(spec), dict(spec.secret_env)))

    spy = Spy()
    mp.register_plugin(spy)
    try:
        q = mp.Queue()
        p = mp.Process(target=sleep_then_put, args=(q, 0))
        p.start()
        q.get(timeout=30)
        p.join(30)
    finally:
        mp.unregister_plugin(spy)
    env, text, secret_env = seen[0]
    secret = mp.get_runtime().secret.hex()
    assert secret_env == {"FIBER_SECRET": secret}
    assert secret not in str(env) and secret not in text
