"""listing.Listed against the stateful fake API: when the chain lists, and Kueue's kinds kept
out while its CRDs are absent, tried again after the backoff, kept between tries once present."""

from __future__ import annotations

import pytest
from controlplane_fakeapi import fake_api

from controlplane.chain import naming
from controlplane.chain.listing import CHAIN_KINDS, Listed
from controlplane.chain.settings import ChainSettings
from controlplane.k8s.client import KubeSettings, open_client

pytestmark = pytest.mark.anyio

SETTINGS = ChainSettings(retry_s=10.0, retry_cap_s=40.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_cache_is_due_before_the_first_list_after_a_period_and_after_a_drop() -> None:
    async with fake_api() as (_fake, url), open_client(KubeSettings.for_tests(url)) as api:
        listed = Listed(api, SETTINGS, Clock())  # lists at 100.0
        assert listed.due(0.0, 60.0)
        await listed.refresh(SETTINGS)
    assert not listed.due(159.0, 60.0) and listed.due(160.0, 60.0)
    listed.drop()
    assert listed.cache is None and listed.due(101.0, 60.0)


async def test_kueue_absent_is_left_out_and_tried_again_only_after_the_backoff() -> None:
    clock = Clock()
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        fake.absent.add("apis/kueue.x-k8s.io")
        fake.put_object("api/v1/namespaces", {"metadata": {"name": "default"}})
        listed = Listed(api, SETTINGS, clock)
        first = await listed.refresh(SETTINGS)
        assert set(first) == set(CHAIN_KINDS) and not listed.kueue_present
        assert len(first[naming.NAMESPACES]) == 1
        fake.absent.clear()  # installed, but the backoff (10 s) has not passed
        clock.now += 9.0
        assert set(await listed.refresh(SETTINGS)) == set(CHAIN_KINDS)
        clock.now += 1.0
        found = await listed.refresh(SETTINGS)
        assert set(found) == set(CHAIN_KINDS) | set(naming.KUEUE_KINDS) and listed.kueue_present
        kept = await listed.refresh(SETTINGS)  # not due: the Kueue kinds last listed are kept
        assert all(kept[k] == found[k] for k in naming.KUEUE_KINDS)


async def test_kueue_unmanaged_is_never_listed() -> None:
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        settings = ChainSettings(manage_kueue=False)
        listed = Listed(api, settings, Clock())
        assert set(await listed.refresh(settings)) == set(CHAIN_KINDS)
        assert not listed.kueue_present
        assert not any(c.startswith("apis/kueue") for c, _, _ in fake.objects)
