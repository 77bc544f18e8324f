"""The bus's Secret, generated in the cluster by the worker at first start and reused after
(controlplane/access/bootstrap.py), against the stateful fake API over real HTTP."""

from __future__ import annotations

import base64

import anyio
import pytest
from controlplane_fakeapi import FakeApi, fake_api

from bus import jwt
from controlplane.access import bootstrap
from controlplane.k8s.client import KubeSettings, open_client

pytestmark = pytest.mark.anyio

SECRETS = "api/v1/secrets"
NS, NAME = "gpustack-system", "gpustack-nats-auth"


def _data(fake: FakeApi) -> dict[str, str]:
    raw = fake.get(SECRETS, NAME, NS)["data"]
    return {k: base64.b64decode(v).decode() for k, v in raw.items()}


async def _ensure(url: str) -> bootstrap.BusAuth:
    async with open_client(KubeSettings.for_tests(url)) as api:
        return await bootstrap.ensure_bus_auth(api, NS, NAME)


async def test_the_first_start_generates_the_keys_and_every_later_start_reuses_them() -> None:
    async with fake_api() as (fake, url):
        first = await _ensure(url)
        stored = _data(fake)
        rv = fake.get(SECRETS, NAME, NS)["metadata"]["resourceVersion"]
        again = await _ensure(url)
        writes = dict(fake.writes)
        rv_after = fake.get(SECRETS, NAME, NS)["metadata"]["resourceVersion"]
    assert again == first and rv_after == rv
    assert writes == {"create": 1}
    assert stored == {"worker-password": first.worker_password,
                      "callout-issuer-seed": first.issuer_seed, "callout-issuer": first.issuer}  # fmt: skip
    key = jwt.NKey(first.issuer_seed)
    assert key.kind == "account" and key.public_key == first.issuer
    assert len(first.worker_password) == 32 and not first.worker_password.isdigit()


async def test_replicas_starting_together_agree_on_one_set_of_keys() -> None:
    got: list[bootstrap.BusAuth] = []
    async with fake_api() as (fake, url):
        hold = fake.hold("POST", f"/api/v1/namespaces/{NS}/secrets", after=True)

        async def one() -> None:
            got.append(await _ensure(url))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
            await hold.reached.wait()  # one create landed; the other replica read 404 too
            hold.release.set()
        creates = fake.writes["create"]
    assert len(got) == 2 and got[0] == got[1]
    assert creates == 1


async def test_a_secret_from_before_the_callout_gets_only_its_missing_keys() -> None:
    async with fake_api() as (fake, url):
        old = base64.b64encode(b"kept-Password1").decode()
        fake.put_object(SECRETS, {"apiVersion": "v1", "kind": "Secret", "data": {
            "worker-password": old}, "metadata": {"name": NAME, "namespace": NS}})  # fmt: skip
        keys = await _ensure(url)
        stored = _data(fake)
    assert keys.worker_password == "kept-Password1"
    assert stored["callout-issuer"] == jwt.NKey(stored["callout-issuer-seed"]).public_key


def test_an_unusable_key_is_refused_not_overwritten() -> None:
    user = jwt.NKey.generate("user")
    with pytest.raises(bootstrap.BusAuthError, match="not an NKey seed"):
        bootstrap.missing({"worker-password": "p", "callout-issuer-seed": "SAnonsense"})
    with pytest.raises(bootstrap.BusAuthError, match="a user seed"):
        bootstrap.missing({"worker-password": "p", "callout-issuer-seed": user.seed})
    account = jwt.NKey.generate("account")
    with pytest.raises(bootstrap.BusAuthError, match="not the public key"):
        bootstrap.missing({"worker-password": "p", "callout-issuer-seed": account.seed,
                           "callout-issuer": user.public_key})  # fmt: skip
    complete = {"worker-password": "p", "callout-issuer-seed": account.seed,
                "callout-issuer": account.public_key}  # fmt: skip
    assert bootstrap.missing(complete) == {}
