"""TLS is one config switch away: every endpoint over TLS (Python's ssl), with a test CA."""

from __future__ import annotations

import pytest

import fibercore as mp
from tests.helpers import make_ca, node_cert
from tests.pool_tasks import square


def _write_ca_and_node(tmp_path):
    ca_file, ca = make_ca(tmp_path)
    return ca_file, node_cert(tmp_path, ca, "localhost", "127.0.0.1")


def put_hello(q):
    q.put("hello over tls")


@pytest.fixture
def tls_runtime(tmp_path):
    ca_file, node_file = _write_ca_and_node(tmp_path)
    mp.init(tls=True, tls_cert_file=node_file, tls_ca_file=ca_file, tls_server_name="localhost",
            start_timeout=30)
    yield
    mp.init()


#: The address scheme of a TLS listener, by transport (the built-in, fiber-nng).
TLS_SCHEMES = {"tcp": "tls+tcp://", "nng": "nng+tls://"}


def test_process_queue_and_pool_over_tls(tls_runtime):
    scheme = TLS_SCHEMES[mp.get_runtime().transport.name]
    q = mp.Queue()
    assert q._address.startswith(scheme)  # the queue broker listens over TLS
    p = mp.Process(target=put_hello, args=(q,))
    p.start()
    assert q.get(timeout=30) == "hello over tls"
    p.join(30)
    assert p.exitcode == 0
    with mp.Pool(2) as pool:
        assert pool._core.address.startswith(scheme)
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
