"""The TLS side of every HTTPS endpoint: its server context and, lacking one, its certificate.

TLS is always on. The certificate is ``tls.crt``/``tls.key`` from ``--cert-dir`` when given, else
a self-signed one made at start-up (in memory, written to a private temporary file only because
:mod:`ssl` loads keys from files, and that file is gone when :func:`tls_context` returns).

Invariants: the context refuses anything older than TLS 1.2; an unreadable certificate or key is
a :class:`~kit.listening.ServingFailed` naming both files, never a half-configured context.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import socket
import ssl
import tempfile
from pathlib import Path

from kit.listening import ServingFailed

__all__ = ["self_signed_certificate", "tls_context"]


def tls_context(cert_dir: str | None) -> tuple[ssl.SSLContext, bytes]:
    """Load ``tls.crt``/``tls.key`` from ``cert_dir``, or make a self-signed pair."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_dir:
        cert, key = Path(cert_dir, "tls.crt"), Path(cert_dir, "tls.key")
        try:
            context.load_cert_chain(cert, key)
            return context, cert.read_bytes()
        except (OSError, ssl.SSLError) as e:
            raise ServingFailed(f"cannot load {cert} and {key}: {e}") from e
    cert_pem, key_pem = self_signed_certificate(socket.gethostname())
    with tempfile.TemporaryDirectory(prefix="gpustack-tls-") as directory:
        cert, key = Path(directory, "tls.crt"), Path(directory, "tls.key")
        cert.write_bytes(cert_pem)
        key.touch(mode=0o600)
        key.write_bytes(key_pem)
        context.load_cert_chain(cert, key)
    return context, cert_pem


def self_signed_certificate(hostname: str) -> tuple[bytes, bytes]:
    """Return (certificate PEM, key PEM) valid a year for ``hostname``, localhost and loopback."""
    from cryptography import x509  # imported here: only services without --cert-dir need it
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname[:64] or "localhost")])
    now = dt.datetime.now(dt.UTC)
    alt_names: list[x509.GeneralName] = [
        x509.DNSName(hostname or "localhost"),
        x509.DNSName("localhost"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("::1")),
    ]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(int.from_bytes(os.urandom(16), "big") >> 1)
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return certificate.public_bytes(serialization.Encoding.PEM), key_pem
