"""NATS NKeys and JWTs: the only module that imports ``nkeys`` (and its ``nacl``).

The bus's trust boundary (:mod:`bus.callout`) needs three things from NATS's JWT world, and
nothing more, so they are written here rather than pulled in from a JWT library that does not
know NATS's ``ed25519-nkey`` algorithm:

- :class:`NKey`: an Ed25519 key pair in NATS's encoding (base32, a type prefix such as ``A`` for
  accounts and ``U`` for users, a CRC16); seeds (``SA…``) are how private keys are stored;
- :func:`encode`: claims as a JWT signed by an NKey: ``base64url(header).base64url(claims)``
  and the Ed25519 signature of those two parts, header ``{"typ":"JWT","alg":"ed25519-nkey"}``;
  ``iss`` is the signer's public key, ``iat`` the time of signing, ``jti`` a hash of the claims;
- :func:`decode`: the inverse, which verifies the signature against the ``iss`` in the claims
  (the key NATS says signed it), the issuer's type and the expiry.

Every failure, whatever the library raised, is :class:`bus.errors.InvalidToken`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
from typing import Any, Final, Literal

import nacl.exceptions
import nacl.signing
import nkeys

from bus.errors import InvalidToken

__all__ = ["HEADER", "NKey", "decode", "encode", "public_key_type", "verify"]

KeyType = Literal["account", "user", "server", "operator"]
HEADER: Final = {"typ": "JWT", "alg": "ed25519-nkey"}
_PREFIX_BYTES: Final[dict[KeyType, int]] = {
    "account": nkeys.PREFIX_BYTE_ACCOUNT,
    "user": nkeys.PREFIX_BYTE_USER,
    "server": nkeys.PREFIX_BYTE_SERVER,
    "operator": nkeys.PREFIX_BYTE_OPERATOR,
}
_TYPES: Final = {v: k for k, v in _PREFIX_BYTES.items()}


class NKey:
    """A private NKey: signs, and names itself by its public key."""

    def __init__(self, seed: str) -> None:
        """:raises InvalidToken: ``seed`` is not an NKey seed (``S`` + type letter + …)."""
        try:
            self._pair = nkeys.from_seed(bytearray(seed.strip().encode("ascii")))
            self.public_key: str = self._pair.public_key.decode("ascii")
        except (nkeys.NkeysError, UnicodeError, binascii.Error, ValueError) as e:
            raise InvalidToken(f"not an NKey seed: {type(e).__name__}") from e
        self.seed = seed.strip()

    @classmethod
    def generate(cls, kind: KeyType) -> NKey:
        """A fresh random key of ``kind`` (e.g. ``account`` for a callout issuer)."""
        raw = bytes(nacl.signing.SigningKey.generate())
        return cls(nkeys.encode_seed(raw, _PREFIX_BYTES[kind]).decode("ascii"))

    @property
    def kind(self) -> KeyType:
        return public_key_type(self.public_key)

    def sign(self, data: bytes) -> bytes:
        return bytes(self._pair.sign(data))


def public_key_type(public_key: str) -> KeyType:
    """The type of a public NKey (``A…`` account, ``U…`` user, ``N…`` server, ``O…``).

    :raises InvalidToken: not a well-formed public NKey (length, prefix or checksum).
    """
    return _decode_public(public_key)[0]


def _decode_public(public_key: str) -> tuple[KeyType, bytes]:
    try:
        raw = base64.b32decode(public_key + "=" * (-len(public_key) % 8))
    except (binascii.Error, ValueError) as e:
        raise InvalidToken(f"not a public NKey: {public_key[:8]!r}…") from e
    body, crc = raw[:-2], raw[-2:]
    if len(raw) != 35 or nkeys.crc16_checksum(body) != crc or body[0] not in _TYPES:
        raise InvalidToken(f"not a public NKey: {public_key[:8]!r}…")
    return _TYPES[body[0]], bytes(body[1:])


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(claims: dict[str, Any], signer: NKey, *, now: float | None = None) -> str:
    """``claims`` as a JWT signed by ``signer`` (``iss``, ``iat`` and ``jti`` set here)."""
    body = {k: v for k, v in claims.items() if k not in ("iss", "iat", "jti")}
    body["iss"] = signer.public_key
    body["iat"] = int(time.time() if now is None else now)
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    digest = base64.b32encode(hashlib.sha256(canonical).digest()).decode().rstrip("=")
    body["jti"] = digest
    head = _b64(json.dumps(HEADER, separators=(",", ":")).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    signature = signer.sign(f"{head}.{payload}".encode("ascii"))
    return f"{head}.{payload}.{_b64(signature)}"


def decode(
    token: str | bytes, *, issuer: KeyType | None = None, now: float | None = None
) -> dict[str, Any]:
    """The claims of ``token`` after checking its header, signature and expiry.

    :param issuer: the type the ``iss`` key must have (``server`` for an authorization request).
    :raises InvalidToken: malformed, signed by another key than ``iss``, of another issuer type,
        or past ``exp``.
    """
    text = token.decode("ascii", "replace") if isinstance(token, bytes) else token
    parts = text.strip().split(".")
    if len(parts) != 3:
        raise InvalidToken("not a JWT (three dot-separated parts)")
    try:
        header, claims = json.loads(_unb64(parts[0])), json.loads(_unb64(parts[1]))
        signature = _unb64(parts[2])
    except (ValueError, binascii.Error) as e:
        raise InvalidToken(f"not a JWT: {type(e).__name__}") from e
    if not isinstance(header, dict) or header.get("alg") != HEADER["alg"]:
        raise InvalidToken(f"JWT algorithm is not {HEADER['alg']}")
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise InvalidToken("JWT claims carry no issuer")
    kind, raw_key = _decode_public(claims["iss"])
    if issuer is not None and kind != issuer:
        raise InvalidToken(f"JWT issued by a {kind} key, expected a {issuer} key")
    try:
        nacl.signing.VerifyKey(raw_key).verify(f"{parts[0]}.{parts[1]}".encode(), signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError) as e:
        raise InvalidToken("JWT signature does not verify") from e
    exp = claims.get("exp")
    if isinstance(exp, int | float) and exp and exp < (time.time() if now is None else now):
        raise InvalidToken("JWT expired")
    return claims


def verify(public_key: str, data: bytes, signature: bytes, *, kind: KeyType = "user") -> None:
    """Check that ``signature`` is ``public_key``'s Ed25519 signature of ``data``.

    :raises InvalidToken: the key is malformed or of another type than ``kind``, or the
        signature does not verify.
    """
    key_type, raw_key = _decode_public(public_key)
    if key_type != kind:
        raise InvalidToken(f"a {key_type} key, expected a {kind} key")
    try:
        nacl.signing.VerifyKey(raw_key).verify(data, signature)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError) as e:
        raise InvalidToken("signature does not verify") from e
