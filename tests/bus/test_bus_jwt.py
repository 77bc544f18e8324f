"""NKeys and NATS JWTs (bus.jwt): encoding, the checks decoding makes, and what is refused.

That a real ``nats-server`` accepts what :func:`bus.jwt.encode` writes is shown end to end in
``test_bus_callout.py`` (every connection there is authorized by a JWT of ours).
"""

from __future__ import annotations

import base64
import json

import pytest

from bus import jwt
from bus.errors import InvalidToken

ACCOUNT = jwt.NKey.generate("account")


def _parts(token: str) -> list[str]:
    return token.split(".")


def _b64(obj: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=").decode()


def test_generated_keys_have_the_prefix_of_their_type() -> None:
    assert ACCOUNT.public_key.startswith("A") and ACCOUNT.seed.startswith("SA")
    user = jwt.NKey.generate("user")
    assert user.public_key.startswith("U") and user.seed.startswith("SU")
    assert user.kind == "user" and ACCOUNT.kind == "account"
    assert jwt.public_key_type(ACCOUNT.public_key) == "account"


def test_a_seed_round_trips_to_the_same_key() -> None:
    again = jwt.NKey(ACCOUNT.seed + "\n")  # as read from a file
    assert again.public_key == ACCOUNT.public_key
    assert again.sign(b"x") == ACCOUNT.sign(b"x")


@pytest.mark.parametrize(
    "seed",
    ["", "SAAA", "not a seed", ACCOUNT.public_key, "SÄ" * 30],
    # Stable ids: the account key is made at import, and xdist's workers must collect alike.
    ids=["empty", "short", "words", "public-key", "non-ascii"],
)
def test_garbage_is_not_a_seed(seed: str) -> None:
    with pytest.raises(InvalidToken):
        jwt.NKey(seed)


@pytest.mark.parametrize(
    "key",
    ["", "A", "ABC", ACCOUNT.public_key[:-1] + ("A" if ACCOUNT.public_key[-1] != "A" else "B")],
    ids=["empty", "one", "three", "bad-checksum"],
)
def test_a_public_key_with_a_bad_length_or_checksum_is_refused(key: str) -> None:
    with pytest.raises(InvalidToken):
        jwt.public_key_type(key)


def test_encode_then_decode_gives_the_claims_with_issuer_time_and_id() -> None:
    token = jwt.encode({"sub": "UABC", "nats": {"type": "user"}}, ACCOUNT, now=1000)
    header = json.loads(base64.urlsafe_b64decode(_parts(token)[0] + "=="))
    assert header == {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = jwt.decode(token, issuer="account")
    assert claims["iss"] == ACCOUNT.public_key and claims["iat"] == 1000
    assert claims["sub"] == "UABC" and claims["nats"] == {"type": "user"}
    assert len(claims["jti"]) == 52  # base32 of a SHA-256, unpadded


def test_the_id_depends_on_the_claims() -> None:
    one = jwt.decode(jwt.encode({"sub": "a"}, ACCOUNT, now=1))["jti"]
    two = jwt.decode(jwt.encode({"sub": "b"}, ACCOUNT, now=1))["jti"]
    assert one != two


def test_a_changed_payload_no_longer_verifies() -> None:
    head, _, sig = _parts(jwt.encode({"sub": "node-a"}, ACCOUNT))
    forged = f"{head}.{_b64({'sub': 'node-b', 'iss': ACCOUNT.public_key})}.{sig}"
    with pytest.raises(InvalidToken, match="signature"):
        jwt.decode(forged)


def test_claims_signed_by_another_key_than_their_issuer_are_refused() -> None:
    other = jwt.NKey.generate("account")
    head, payload, _ = _parts(jwt.encode({"sub": "x"}, ACCOUNT))
    _, _, other_sig = _parts(jwt.encode({"sub": "x"}, other))
    with pytest.raises(InvalidToken, match="signature"):
        jwt.decode(f"{head}.{payload}.{other_sig}")


def test_the_issuer_type_is_checked() -> None:
    token = jwt.encode({"sub": "x"}, jwt.NKey.generate("user"))
    with pytest.raises(InvalidToken, match="user key, expected a server key"):
        jwt.decode(token, issuer="server")


def test_an_expired_token_is_refused_and_a_current_one_accepted() -> None:
    token = jwt.encode({"sub": "x", "exp": 2000}, ACCOUNT, now=1000)
    assert jwt.decode(token, now=1999)["exp"] == 2000
    with pytest.raises(InvalidToken, match="expired"):
        jwt.decode(token, now=2001)


@pytest.mark.parametrize(
    "token",
    [
        "",
        "a.b",
        "a.b.c.d",
        "!!!.???.***",
        f"{_b64({'alg': 'none'})}.{_b64({'iss': ACCOUNT.public_key})}.",
        f"{_b64({'alg': 'ed25519-nkey'})}.{_b64(['not', 'an', 'object'])}.",
        f"{_b64({'alg': 'ed25519-nkey'})}.{_b64({'sub': 'no issuer'})}.",
        f"{_b64({'alg': 'ed25519-nkey'})}.{_b64({'iss': 'UNOTAKEY'})}.",
    ],
)
def test_garbage_is_refused_as_an_invalid_token(token: str) -> None:
    with pytest.raises(InvalidToken):
        jwt.decode(token)


def test_bytes_are_accepted_as_received_from_the_wire() -> None:
    token = jwt.encode({"sub": "x"}, ACCOUNT)
    assert jwt.decode(token.encode())["sub"] == "x"
