"""wss://: the CLI verifies TLS normally, so a relay with a private CA works once that CA
is trusted (here through SSL_CERT_FILE) and fails clearly (exit 2) when it is not."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

import pytest
from cli_support import Keys, engram
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca_and_server_cert(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost signed by it."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("engram test CA"))
        .issuer_name(_name("engram test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("127.0.0.1"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    ca_path, cert_path, key_path = (
        directory / "ca.pem",
        directory / "server.pem",
        directory / "server.key",
    )
    ca_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    cert_path.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return ca_path, cert_path, key_path


@pytest.fixture
def tls_relay(start_relay, tmp_path: Path):  # type: ignore[no-untyped-def]
    ca, cert, key = make_ca_and_server_cert(tmp_path)
    rp = start_relay(args=("--tls-cert", str(cert), "--tls-key", str(key)), scheme="wss")
    return rp, ca


def test_cli_over_wss_with_the_ca_trusted(tls_relay) -> None:  # type: ignore[no-untyped-def]
    rp, ca = tls_relay
    assert rp.url.startswith("wss://")
    keys = Keys.fresh()
    env = keys.agent_env(rp.url, SSL_CERT_FILE=str(ca))
    written = engram("mem", "set", "over/tls", "secret sauce", env=env)
    assert written.returncode == 0, written.stderr
    got = engram("mem", "get", "over/tls", env=env)
    assert (got.returncode, got.stdout) == (0, b"secret sauce")
    listed = engram("mem", "ls", env=env)  # NIP-11 over https too
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.startswith(b"mem/over/tls\t")


def test_cli_over_wss_with_the_ca_not_trusted(tls_relay, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    rp, _ca = tls_relay
    other = tmp_path / "other"
    other.mkdir()
    other_ca, _, _ = make_ca_and_server_cert(other)  # a CA that signed nothing here
    keys = Keys.fresh()
    for extra in ({}, {"SSL_CERT_FILE": str(other_ca)}):
        env = keys.agent_env(rp.url, **extra)
        for args in (("mem", "get", "x"), ("mem", "set", "x", "v")):
            result = engram(*args, env=env)
            assert result.returncode == 2, result.stderr
            err = result.stderr.decode()
            assert err.count("\n") == 1
            assert "TLS certificate verification failed" in err, err
