"""Real HTTP peers for the Hub client's tests: Debian's nginx and tinyproxy, on free loopback
ports, with everything (configuration, files, logs, certificates) in one temporary directory.

nginx serves ``www/`` over plain HTTP and over TLS (a certificate signed by a CA made here, the
CA being what the client is given), with keep-alive, gzip (so a compressible answer comes
``chunked``), byte ranges, ETags and a few redirects. Its access log records, per request, the
connection serial number (``$connection``) and the request's number on it
(``$connection_requests``), and whether an ``Authorization`` header came: the oracle for
connection reuse and for the token rule. tinyproxy is a real forward proxy (absolute-form GETs
and ``CONNECT``), with Basic authentication.

A missing binary skips the tests, unless ``GPUSTACK_REQUIRE_PEERS`` is set (``.ci/run`` sets it
and installs both), when it fails them.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from bus.embedded import free_port

PROXY_USER, PROXY_PASSWORD = "alice", "s3cret"


def require(binary: str) -> str:
    """The binary's path; skip (or fail, with ``GPUSTACK_REQUIRE_PEERS``) when it is missing."""
    path = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/usr/bin")
    if path is None:
        reason = f"{binary} is not installed (Debian: apt-get install nginx-light tinyproxy)"
        if os.environ.get("GPUSTACK_REQUIRE_PEERS"):
            pytest.fail(f"GPUSTACK_REQUIRE_PEERS is set but {reason}")
        pytest.skip(reason)
    return path


@dataclass(frozen=True)
class Peers:
    root: Path
    plain: int
    """nginx's plain HTTP port."""
    tls: int
    """nginx's HTTPS port."""
    proxy: int
    """tinyproxy's port (Basic authentication: :data:`PROXY_USER`)."""
    ca_file: str
    short: int
    """nginx's plain HTTP port that closes a connection after its third request."""

    @property
    def www(self) -> Path:
        return self.root / "www"

    def logged(self, *uris: str) -> list[tuple[str, str, int, int, str, bool]]:
        """:meth:`log` once it has a line for each of ``uris``: nginx writes a request's line
        after sending the answer, so a client may have read it before the line is there."""
        deadline = time.monotonic() + 20
        while True:
            rows = self.log()
            if set(uris) <= {r[1] for r in rows} or time.monotonic() > deadline:
                return rows
            time.sleep(0.01)

    def log(self) -> list[tuple[str, str, int, int, str, bool]]:
        """nginx's access log so far: (server port, uri, connection, request on it, status,
        whether an Authorization header came)."""
        rows = []
        for line in (self.root / "access.log").read_text().splitlines():
            port, uri, conn, number, status, auth = line.split(" ", 5)
            rows.append((port, uri, int(conn), int(number), status, auth != "-"))
        return rows


def _certificates(root: Path) -> str:
    """A CA and a certificate it signed for 127.0.0.1 and localhost (nginx's); the CA's path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peers test CA")])
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])

    def signed(subject: x509.Name, public: object, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public)  # type: ignore[arg-type]
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            usage = x509.KeyUsage(False, False, False, False, False, True, True, False, False)
            builder = builder.add_extension(usage, critical=True)
        else:
            names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    pem = serialization.Encoding.PEM
    ca_cert = signed(ca_name, ca_key.public_key(), ca=True)
    cert = signed(name, key.public_key(), ca=False)
    (root / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (root / "server.pem").write_bytes(cert.public_bytes(pem) + ca_cert.public_bytes(pem))
    (root / "server.key").write_bytes(
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(root / "ca.pem")


def _nginx_conf(root: Path, plain: int, tls: int, short: int) -> str:
    temp = " ".join(f"{d}_temp_path {root}/tmp-{d};" for d in ("client_body", "proxy",
                    "fastcgi", "uwsgi", "scgi"))  # fmt: skip
    return f"""
daemon off;
master_process off;
pid {root}/nginx.pid;
error_log {root}/error.log info;
events {{}}
http {{
  log_format peers '$server_port $request_uri $connection $connection_requests $status '
                   '$http_authorization';
  access_log {root}/access.log peers;
  {temp}
  types {{ application/octet-stream bin; text/plain txt; application/json json; }}
  keepalive_requests 1000;
  keepalive_timeout 60s;
  gzip on;
  gzip_types text/plain;
  gzip_min_length 0;
  etag on;
  server {{
    listen 127.0.0.1:{plain};
    root {root}/www;
    location = /moved {{ return 302 /files/small.txt?$args; }}
    location = /moved-twice {{ return 301 /moved?$args; }}
  }}
  server {{
    listen 127.0.0.1:{short};
    root {root}/www;
    keepalive_requests 3;
  }}
  server {{
    listen 127.0.0.1:{tls} ssl;
    ssl_certificate {root}/server.pem;
    ssl_certificate_key {root}/server.key;
    root {root}/www;
    location = /moved {{ return 307 /files/small.txt; }}
    location = /to-plain {{ return 302 http://127.0.0.1:{plain}/files/small.txt?$args; }}
  }}
}}
"""


def _tinyproxy_conf(root: Path, port: int) -> str:
    return f"""
Port {port}
Listen 127.0.0.1
Timeout 60
LogFile "{root}/tinyproxy.log"
LogLevel Info
MaxClients 32
Allow 127.0.0.1
BasicAuth {PROXY_USER} {PROXY_PASSWORD}
"""


def _wait_listening(port: int, process: subprocess.Popen[bytes], name: str, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:] if log.exists() else ''}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen on {port}")


@contextmanager
def running_peers(root: Path) -> Iterator[Peers]:
    nginx, tinyproxy = require("nginx"), require("tinyproxy")
    (root / "www" / "files").mkdir(parents=True)
    ca_file = _certificates(root)
    plain, tls, proxy, short = free_port(), free_port(), free_port(), free_port()
    (root / "nginx.conf").write_text(_nginx_conf(root, plain, tls, short))
    (root / "tinyproxy.conf").write_text(_tinyproxy_conf(root, proxy))
    out = (root / "peers.out").open("wb")
    started: list[subprocess.Popen[bytes]] = []
    try:
        web = subprocess.Popen(
            [nginx, "-p", str(root), "-c", str(root / "nginx.conf")], stdout=out, stderr=out
        )
        started.append(web)
        fwd = subprocess.Popen(
            [tinyproxy, "-d", "-c", str(root / "tinyproxy.conf")], stdout=out, stderr=out
        )
        started.append(fwd)
        for port in (plain, tls, short):
            _wait_listening(port, web, "nginx", root / "error.log")
        _wait_listening(proxy, fwd, "tinyproxy", root / "tinyproxy.log")
        yield Peers(root, plain, tls, proxy, ca_file, short)
    finally:
        for process in started:
            process.terminate()
        for process in started:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        out.close()
