"""TLS is one config switch away: every endpoint over TLS (Python's ssl), with a test CA."""

from __future__ import annotations

import datetime
import ipaddress

import pytest

import fibercore as mp
from tests.pool_tasks import square


def _write_ca_and_node(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fibercore test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
          .not_valid_after(now + datetime.timedelta(days=2))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=2))
            .add_extension(x509.SubjectAlternativeName(names), critical=False).sign(ca_key, hashes.SHA256()))
    ca_file, node_file = tmp_path / "ca.pem", tmp_path / "node.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    node_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return str(ca_file), str(node_file)


def put_hello(q):
    q.put("hello over tls")


@pytest.fixture
def tls_runtime(tmp_path):
    ca_file, node_file = _write_ca_and_node(tmp_path)
    mp.init(tls=True, tls_cert_file=node_file, tls_ca_file=ca_file, tls_server_name="localhost",
            start_timeout=30)
    yield
    mp.init()


def test_process_queue_and_pool_over_tls(tls_runtime):
    assert mp.get_runtime().transport._scheme == "tls+tcp"
    q = mp.Queue()
    assert q._address.startswith("tls+tcp://")  # the queue broker listens over TLS
    p = mp.Process(target=put_hello, args=(q,))
    p.start()
    assert q.get(timeout=30) == "hello over tls"
    p.join(30)
    assert p.exitcode == 0
    with mp.Pool(2) as pool:
        assert pool._core.address.startswith("tls+tcp://")
        assert pool.map(square, range(20)) == [x * x for x in range(20)]
