"""The certificate the API server verifies the webhooks by, and the CA bundle it is told to use.

With ``--cert-dir`` the operator owns the certificate: the bundle is its ``ca.crt`` when there
is one, else ``tls.crt`` itself (a self-signed certificate is its own CA). Without it, the worker
keeps a small CA of its own in the Secret ``gpustack-operator-worker-webhook-ca`` in its
namespace, created by whichever replica starts first (a create that loses the race reads the
winner's), and every replica issues itself a serving certificate from it at start, for the
Service's DNS names. So the replicas share one bundle, and a restart keeps it.

Keys never touch a disk that outlives the process: the issued pair is written to a private
temporary directory only while the HTTPS server loads it (:mod:`ssl` reads keys from files).
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Final

import msgspec
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from controlplane import errors
from controlplane.admission.webhooks import WebhookSettings
from controlplane.k8s.client import KubeClient
from controlplane.resources import SECRETS, Ref
from kit.httpsettings import HttpsSettings

__all__ = ["CA_SECRET", "authority", "issue", "new_authority", "serving_identity"]

CA_SECRET: Final = "gpustack-operator-worker-webhook-ca"
_PEM: Final = serialization.Encoding.PEM


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(_PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def _builder(subject: str, days: int) -> x509.CertificateBuilder:
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject[:64])]))
        .serial_number(int.from_bytes(os.urandom(16), "big") >> 1)
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
    )


def new_authority() -> tuple[bytes, bytes]:
    """A CA (certificate PEM, key PEM) valid ten years: it only signs the worker's certificates."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = "gpustack-operator webhook CA"
    cert = (
        _builder(name, 3650)
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
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
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(_PEM), _key_pem(key)


def issue(ca_pem: bytes, ca_key_pem: bytes, names: Sequence[str]) -> tuple[bytes, bytes]:
    """A serving certificate for DNS ``names`` signed by the CA, valid a year (a restart
    issues a new one)."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError("the webhook CA key is not an EC key")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(names[0], 365)
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(_PEM), _key_pem(key)


def service_names(settings: WebhookSettings) -> list[str]:
    """The names the API server may dial the Service by."""
    svc, ns = settings.service or "localhost", settings.namespace
    return [f"{svc}.{ns}.svc", f"{svc}.{ns}.svc.cluster.local", f"{svc}.{ns}", svc]


async def authority(api: KubeClient, namespace: str) -> tuple[bytes, bytes]:
    """The shared CA from its Secret, created when absent. :raises ApiError: the API refused."""
    ref = Ref(resource=SECRETS, name=CA_SECRET, namespace=namespace)
    try:
        return _pair(await api.get(ref))
    except errors.NotFound:
        pass
    cert, key = new_authority()
    data = {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()}
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls", "data": data,
        "metadata": {"name": CA_SECRET, "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "gpustack-operator"}},
    }  # fmt: skip
    try:
        await api.create(ref, body)
    except errors.Conflict:  # another replica made it first: use theirs
        return _pair(await api.get(ref))
    return cert, key


def _pair(secret: dict[str, Any]) -> tuple[bytes, bytes]:
    data = secret.get("data") or {}
    try:
        return base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"])
    except (KeyError, ValueError, TypeError) as e:
        raise errors.ApiError(0, f"Secret {CA_SECRET} holds no tls.crt and tls.key") from e


class Identity(msgspec.Struct, frozen=True, kw_only=True):
    https: HttpsSettings
    """The serving settings, ``cert_dir`` naming the certificate to serve."""
    ca_bundle: bytes


@asynccontextmanager
async def serving_identity(
    api: KubeClient, https: HttpsSettings, webhooks: WebhookSettings
) -> AsyncIterator[Identity]:
    """The certificate to serve and the bundle that verifies it; the temporary files of an
    issued certificate are gone when the block exits (serve inside it, it loads them)."""
    if https.cert_dir:
        yield Identity(https=https, ca_bundle=_bundle(https.cert_dir))
        return
    ca_pem, ca_key = await authority(api, webhooks.namespace)
    cert, key = issue(ca_pem, ca_key, service_names(webhooks))
    with tempfile.TemporaryDirectory(prefix="gpustack-webhook-tls-") as directory:
        _write_pair(directory, cert + ca_pem, key)
        yield Identity(https=msgspec.structs.replace(https, cert_dir=directory), ca_bundle=ca_pem)


def _bundle(cert_dir: str) -> bytes:
    """``ca.crt`` when the directory has one, else the certificate itself."""
    ca = Path(cert_dir, "ca.crt")
    return (ca if ca.is_file() else Path(cert_dir, "tls.crt")).read_bytes()


def _write_pair(directory: str, cert: bytes, key: bytes) -> None:
    Path(directory, "tls.crt").write_bytes(cert)
    key_path = Path(directory, "tls.key")
    key_path.touch(mode=0o600)
    key_path.write_bytes(key)
