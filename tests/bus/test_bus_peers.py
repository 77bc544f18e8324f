"""The peer contract (bus/peers.py): offers as readers must take them, request signatures, and
who may offer what on a real server with the callout on."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from bus import callout, connection, identity, jwt, peers, testing
from bus.errors import InvalidToken
from bus.identity import Identity

KEY = jwt.NKey.generate("user")
OFFER = peers.PeerOffer(node="gpu-a.x", url="http://10.0.0.1:32445", key=KEY.public_key,
                        digests=("ab" * 32,))  # fmt: skip


def test_an_offer_is_taken_only_on_its_own_nodes_subject() -> None:
    payload = peers.encode_offer(OFFER)
    assert peers.subject("gpu-a.x") == "gpustack.v1.peers.gpu-a%2Ex"
    assert peers.decode_offer(peers.subject("gpu-a.x"), payload) == OFFER
    assert peers.decode_offer(peers.subject("gpu-b"), payload) is None  # speaks for another


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        peers.encode_offer(OFFER).replace(b'"v":1', b'"v":2'),
        peers.encode_offer(OFFER).replace(b"http://", b"file://"),
        peers.encode_offer(OFFER).replace(b'"' + b"ab" * 32 + b'"', b'"../x"'),
        # an account key is not a peer key
        peers.encode_offer(OFFER).replace(
            KEY.public_key.encode(), jwt.NKey.generate("account").public_key.encode()
        ),
        b"{" + b" " * (600 * 1024) + b"}",
    ],
    ids=["garbage", "version", "scheme", "digest", "key-type", "size"],
)
def test_a_bad_offer_is_dropped(payload: bytes) -> None:
    assert peers.decode_offer(peers.subject("gpu-a.x"), payload) is None


def test_a_request_is_admitted_only_signed_by_the_offered_key_for_this_server() -> None:
    path = "/peer/v1/trees/" + "ab" * 32
    keys = {"gpu-a.x": KEY.public_key}
    good = peers.authorization(KEY, "server-1", "gpu-a.x", 1000, path)
    assert (
        peers.verify_request(good, server="server-1", path=path, now=1030, key_of=keys) == "gpu-a.x"
    )
    refusals = [
        ("server-2", path, 1000),  # a signature for another server
        ("server-1", path + "/files/x", 1000),  # for another path
        ("server-1", path, 1000 + peers.SKEW_S + 1),  # too old
        ("server-1", path, 1000 - peers.SKEW_S - 1),  # from the future
    ]
    for server, asked, now in refusals:
        with pytest.raises(InvalidToken):
            peers.verify_request(good, server=server, path=asked, now=now, key_of=keys)
    other = jwt.NKey.generate("user")
    forged = peers.authorization(other, "server-1", "gpu-a.x", 1000, path)
    with pytest.raises(InvalidToken, match="does not verify"):
        peers.verify_request(forged, server="server-1", path=path, now=1000, key_of=keys)
    with pytest.raises(InvalidToken, match="offers no peer key"):
        peers.verify_request(good, server="server-1", path=path, now=1000, key_of={})
    for bad in ("Bearer x", "GPUStack-Peer", "GPUStack-Peer a:b:c", "GPUStack-Peer a:1:AAAA"):
        with pytest.raises(InvalidToken):
            peers.verify_request(bad, server="server-1", path=path, now=1000, key_of=keys)


def test_a_model_agent_offers_on_its_own_subject_and_reads_everyones() -> None:
    perms = identity.permissions_for(Identity(role="model-manager", node="gpu-a.x"))
    assert peers.subject("gpu-a.x") in perms.pub_allow
    assert peers.subject("gpu-b") not in perms.pub_allow
    assert peers.ALL in perms.sub_allow
    for other in (Identity(role="device-manager", node="gpu-a.x"), Identity(role="dashboard")):
        p = identity.permissions_for(other)
        assert peers.ALL not in p.sub_allow and peers.subject("gpu-a.x") not in p.pub_allow


TOKENS = {
    "mm-a": Identity(role="model-manager", node="gpu-a"),
    "mm-b": Identity(role="model-manager", node="gpu-b"),
    "dm-a": Identity(role="device-manager", node="gpu-a"),
}


@pytest.mark.anyio
async def test_the_server_refuses_an_offer_for_another_node(tmp_path: Path) -> None:
    got: list[tuple[str, bytes]] = []

    def keep(subject: str, payload: bytes) -> None:
        got.append((subject, payload))

    async with testing.callout_server(tmp_path, callout.token_table(TOKENS)) as bus:
        reader = bus.settings_as(TOKENS["mm-a"], "mm-a")
        async with (
            connection.connect(reader, retry=False) as conn_a,
            conn_a.subscribe(peers.ALL, keep),
        ):
            await conn_a.flush()
            for token, subject in (
                ("mm-b", peers.subject("gpu-a")),  # gpu-b may not speak for gpu-a
                ("dm-a", peers.subject("gpu-a")),  # nor gpu-a's device agent
                ("mm-b", peers.subject("gpu-b")),  # what it may
            ):
                settings = bus.settings_as(TOKENS[token], token)
                async with connection.connect(settings, retry=False) as conn:
                    await conn.publish(subject, token.encode())
                    await conn.flush()

            async def delivered() -> bool:
                return bool(got)

            await testing.eventually(delivered)
            await anyio.sleep(0.2)  # anything refused would have arrived by now, in order
    assert got == [(peers.subject("gpu-b"), b"mm-b")]
