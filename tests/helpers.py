"""Module-level job targets for the core tests (workers import them by reference)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def cpu_burners(n: int) -> Iterator[None]:
    """``n`` processes burning a CPU each while the block runs (a busy machine), stopped by
    their PIDs after it."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def put_items(q: Any, items: list[Any]) -> None:
    for item in items:
        q.put(item)


def put_get_then_fork_and_put(q: Any, back: Any) -> None:
    """Get and put through ``q`` (its client is now kept on the handle), then put from a process
    forked from this job with ``os.fork`` (which must make a client of its own), then from
    this job again."""
    back.put(("job", q.get(timeout=60)))
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            back.put(("forked", q.get(timeout=60)))
            back.close()
            back.join_thread()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    back.put(("job", os.waitstatus_to_exitcode(status)))


def drain(q: Any, out: Any, sentinel_count: int = 1) -> None:
    got = []
    seen = 0
    while seen < sentinel_count:
        item = q.get(timeout=60)
        if item is None:
            seen += 1
        else:
            got.append(item)
    out.put(got)


def pipe_send_all(conn: Any, items: list[Any]) -> None:
    for item in items:
        conn.send(item)
    conn.close()


def pipe_send_paced(conn: Any, items: list[tuple[Any, bool]]) -> None:
    """Send each item, pausing after those marked (so that sends alternate between the idle
    line's one-step path and the sender's bursts)."""
    import time

    for item, pause in items:
        conn.send(item)
        if pause:
            time.sleep(0.0005)
    conn.close()


def pipe_collect(conn: Any, n: int) -> None:
    """Receive ``n`` objects and send them back as one list."""
    conn.send([conn.recv() for _ in range(n)])


def wait_for_event(event: Any, shared: Any) -> None:
    """Wait for ``event`` (a synchronization service's), then record it in ``shared`` (a
    manager's dict)."""
    shared["waited"] = event.wait(120)


def pipe_bytes_echo(conn: Any) -> None:
    conn.send_bytes(conn.recv_bytes() * 2)


def sleep_then_put(q: Any, seconds: float) -> None:
    time.sleep(seconds)
    q.put(os.getpid())


def get_meta_env(q: Any) -> None:
    q.put(dict(os.environ).get("FIBER_BACKEND"))


def joinable_worker(q: Any) -> None:
    while True:
        item = q.get(timeout=60)
        q.task_done()
        if item is None:
            return


def array_roundtrip(conn: Any) -> None:
    arr = conn.recv()
    arr += 1  # writable after the trip
    conn.send(arr)


def get_one_then_sleep(q: Any, done: Any) -> None:
    q.get(timeout=60)
    done.put("got one")
    time.sleep(120)


def pipe_forward(conn: Any, out: Any, n: int) -> None:
    out.put([conn.recv() for _ in range(n)])


def report_parent(conn: Any) -> None:
    import multiprocessing

    conn.send((os.getpid(), multiprocessing.parent_process().is_alive()))
    multiprocessing.parent_process().join(30)
    conn.send((os.getpid(), multiprocessing.parent_process().is_alive()))


def start_reporter_then_wait(conn: Any) -> None:
    import fibercore

    fibercore.Process(target=report_parent, args=(conn,)).start()
    time.sleep(300)


def put_megabytes(q: Any, count: int) -> None:
    """``count`` items of 1 MiB each, numbered in their first bytes."""
    for i in range(count):
        q.put(i.to_bytes(4, "little") + bytes(1 << 20))


def tcp_target(address: str) -> tuple[str, int]:
    """(host, port) of a channel address ``tcp://host:port[/machine][#identity]``."""
    where = address.split("://", 1)[1].partition("#")[0].partition("/")[0]
    host, _, port = where.rpartition(":")
    return host.strip("[]"), int(port)


def connected_router(rt: Any) -> tuple[Any, Any, Any]:
    """A listening router channel, a channel dialled to it, and the dialler as the hub's peer."""
    hub = rt.listen("router")
    spoke = rt.dial("router", hub.address)
    spoke.send([(1, [b"hello"])])
    messages, peer = hub.recv(timeout=10)
    assert messages[0][0] == 1
    return hub, spoke, peer


def pipe_echo_n(conn: Any, n: int) -> None:
    """Echo ``n`` messages, then wait for one more before leaving."""
    for _ in range(n):
        conn.send_bytes(conn.recv_bytes())
    conn.recv_bytes()


def node_cert(tmp_path: Path, ca: tuple[Any, Any], name: str, ip: str | None) -> str:
    """A certificate the test CA signed for ``name`` (and ``ip``), key included."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    ca_cert, ca_key = ca
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[Any] = [x509.DNSName(name)] + ([x509.IPAddress(ipaddress.ip_address(ip))] if ip else [])
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(names), critical=False).sign(ca_key, hashes.SHA256()))
    path = tmp_path / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(path)


def tls_settings() -> dict[str, str]:
    """A transport's TLS settings with a fresh test CA and a node certificate for localhost
    and 127.0.0.1 (what ``tls_cert_file``, ``tls_ca_file``, ``tls_server_name`` give it)."""
    import tempfile

    where = Path(tempfile.mkdtemp(prefix="fiber-tls-"))
    ca_file, ca = make_ca(where)
    return {"cert": node_cert(where, ca, "localhost", "127.0.0.1"), "ca": ca_file, "server_name": "localhost"}


def make_ca(tmp_path: Path) -> tuple[str, tuple[Any, Any]]:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fibercore relay-test CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(key, hashes.SHA256()))
    path = tmp_path / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path), (cert, key)


def session_processes(session: str) -> list[int]:
    """Pids of this machine's processes whose environment names ``session``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if f"FIBER_SESSION={session}".encode() in fh.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def pipe_send_sleep_send(conn: Any, first: Any, seconds: float, second: Any) -> None:
    """Send ``first``, stay silent for ``seconds`` (connected), then send ``second``."""
    conn.send(first)
    time.sleep(seconds)
    conn.send(second)


def eventually(predicate: Any, timeout: float = 10.0) -> None:
    """Wait until ``predicate()`` is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not true within {timeout} s"
        time.sleep(0.01)


def pipe_hello_sleep_bye(conn: Any, i: int, seconds: float) -> None:
    """Send ``("hello", i, when)`` (``when`` on the machine's monotonic clock), stay silent
    for ``seconds`` (connected), then send ``("bye", i)``."""
    conn.send(("hello", i, time.monotonic()))
    time.sleep(seconds)
    conn.send(("bye", i))


def pipe_lane_behaviour(conn: Any) -> None:
    """A child's end (its lane): poll and recv timeouts, a burst of sends, then EOF."""
    t0 = time.monotonic()
    conn.send(("polled", conn.poll(0.3), round(time.monotonic() - t0, 2)))
    item = conn.recv()
    for i in range(item):
        conn.send(i)
    try:
        conn.recv()
    except EOFError:
        try:
            conn.send("after eof")
        except BrokenPipeError:  # as multiprocessing: the reader is gone
            return
    raise AssertionError("no EOFError, or no BrokenPipeError after it")


def pipe_line_echo(conn: Any) -> None:
    """Echo objects; answer "line?" with whether this end sends and reads on its line
    (:mod:`fibercore.pipes.line`); stop at None."""
    while True:
        item = conn.recv()
        if item is None:
            return
        conn.send(conn._network.line is not None if item == "line?" else item)


def pipe_count_to_eof(conn: Any, results: Any, delay: float = 0.0) -> None:
    """After ``delay`` seconds, count what arrives until the end of the pipe, then put the
    count in ``results``."""
    import time

    time.sleep(delay)
    n = 0
    try:
        while True:
            conn.recv()
            n += 1
    except EOFError:
        results.put(n)


def take_n(q: Any, out: Any, n: int) -> None:
    """Get ``n`` items from ``q`` and put the list of them on ``out``."""
    out.put([q.get(timeout=120) for _ in range(n)])


def report_each(q: Any, out: Any, n: int, ack_only_when_asked: bool = False) -> None:
    """Get ``n`` items from ``q``, putting each on ``out`` as soon as it was got. With
    ``ack_only_when_asked`` this reader never acknowledges what it consumed by itself (no
    ACK every few items, none when idle): the queue's broker learns it only by asking (COUNT)."""
    if ack_only_when_asked:
        from fibercore.queues import client

        client.QUIET = 3600.0  # the background thread and an idle get acknowledge after this
        reader = client.client_for(q._address, q._qid, q._maxsize)
        reader.ack_every = reader.ack_bytes = 1 << 62
    for _ in range(n):
        out.put(q.get(timeout=120))


def count_changed(source: Any, reply: Any, n: int) -> None:
    """Take ``n`` buffers (arrays, bytearrays) from a Pipe end or Queue and tell ``reply``
    how many are not all ones, as each was when it was sent."""
    import numpy as np

    get = source.recv if hasattr(source, "recv") else source.get
    changed = 0
    for _ in range(n):
        got = get()
        view = np.frombuffer(got, dtype=np.uint8) if isinstance(got, (bytes, bytearray)) else got
        changed += not bool((view == 1).all())
    (reply.send if hasattr(reply, "send") else reply.put)(changed)
