"""The Node informer and paged lists, against the stateful fake API over HTTP.

What is checked: a paged list reads every page and starts over when its continue token expired
(410), an unknown token is a 400; the informer tells its listeners every Node added, changed and
deleted, is silent about the echo of a write it was told of, resumes a stream that ended, lists
again after a 410 and after a failed watch, and reports a Node deleted while its watch was down
as ``DELETED``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest
from controlplane_fakeapi import FakeApi, fake_api, node

from bus.testing import eventually
from controlplane import errors
from controlplane.k8s.client import KubeClient, KubeSettings, open_client
from controlplane.k8s.informing import Informer
from controlplane.resources import NODES, Ref

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own
COLL = "api/v1/nodes"
PATH = "/api/v1/nodes"


@asynccontextmanager
async def api_with(names: list[str]) -> AsyncIterator[tuple[FakeApi, KubeClient]]:
    async with fake_api() as (fake, url):
        for name in names:
            fake.put_object(COLL, node(name))
        async with open_client(KubeSettings.for_tests(url, backoff_s=0.01)) as api:
            yield fake, api


class Heard:
    """A listener that keeps what it was told."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, str]] = []

    def __call__(self, kind: str, name: str, body: dict[str, Any]) -> None:
        assert body["metadata"]["name"] == name
        self.changes.append((kind, name))

    def saw(self, kind: str, name: str) -> int:
        return self.changes.count((kind, name))


@asynccontextmanager
async def informing(api: KubeClient) -> AsyncIterator[tuple[Informer, Heard]]:
    informer = Informer(api, NODES, retry_s=0.01)
    heard = Heard()
    informer.listen(heard)
    async with anyio.create_task_group() as tg:
        tg.start_soon(informer.run)
        await informer.ready.wait()
        yield informer, heard
        tg.cancel_scope.cancel()


async def test_a_paged_list_reads_every_page() -> None:
    async with api_with(["n5", "n1", "n4", "n2", "n3"]) as (fake, api):
        listing = await api.listing(NODES, limit=2)
        assert [b["metadata"]["name"] for b in listing.items] == ["n1", "n2", "n3", "n4", "n5"]
        assert fake.lists[COLL] == 3
        assert listing.resource_version == fake.get(COLL, "n3")["metadata"]["resourceVersion"]
        assert len(await api.list(NODES)) == 5  # one page of 500
        assert fake.lists[COLL] == 4


async def test_an_expired_continue_starts_the_list_over() -> None:
    async with api_with(["n1", "n2", "n3", "n4", "n5"]) as (fake, api):
        held = fake.hold("GET", PATH, after=True)  # the first page, answered late
        async with anyio.create_task_group() as tg:

            async def listing() -> None:
                names = [b["metadata"]["name"] for b in (await api.listing(NODES, limit=2)).items]
                assert names == ["n1", "n2", "n3", "n4", "n5", "n6"]

            tg.start_soon(listing)
            await held.reached.wait()
            fake.put_object(COLL, node("n6"))
            fake.compact()  # the first page's resourceVersion is history now
            held.release.set()
        assert fake.lists[COLL] == 1 + 1 + 3  # page 1, the 410, then three pages again


async def test_a_continue_token_the_server_never_gave_is_refused() -> None:
    async with api_with(["n1"]) as (_fake, api):
        with pytest.raises(errors.Invalid) as refused:
            await api.request("GET", PATH, query=[("limit", "2"), ("continue", "nonsense")])
        assert refused.value.status == 400


async def test_a_list_expiring_again_and_again_gives_up_with_gone() -> None:
    async with api_with(["n1"]) as (fake, api):
        fake.fail_next("GET", PATH, 410, times=3)
        assert len(await api.list(NODES)) == 1  # started over three times
        fake.fail_next("GET", PATH, 410, times=4)
        with pytest.raises(errors.Gone):
            await api.list(NODES)


async def test_listeners_hear_nodes_added_changed_and_deleted() -> None:
    async with api_with(["n1", "n2"]) as (fake, api), informing(api) as (informer, heard):
        assert heard.changes == [("ADDED", "n1"), ("ADDED", "n2")]
        fake.put_object(COLL, node("n3"))
        await api.patch(Ref(resource=NODES, name="n1"), {"metadata": {"labels": {"a": "b"}}})
        fake.remove(COLL, "n2")

        async def all_heard() -> bool:
            return heard.saw("DELETED", "n2") == 1

        await eventually(all_heard)
        assert heard.changes[2:] == [("ADDED", "n3"), ("MODIFIED", "n1"), ("DELETED", "n2")]
        assert set(informer.objects) == {"n1", "n3"}
        assert informer.objects["n1"]["metadata"]["labels"]["a"] == "b"
        assert fake.lists[COLL] == 1 and informer.lists == 1


async def test_the_echo_of_a_write_it_was_told_is_no_change() -> None:
    async with api_with(["n1"]) as (fake, api), informing(api) as (informer, heard):
        ref = Ref(resource=NODES, name="n1")
        informer.put(await api.patch(ref, {"metadata": {"labels": {"a": "b"}}}))
        await api.patch(ref, {"metadata": {"labels": {"c": "d"}}})  # someone else's write
        fake.put_object(COLL, node("n2"))  # after both echoes in the stream

        async def n2() -> bool:
            return heard.saw("ADDED", "n2") == 1

        await eventually(n2)
        assert heard.saw("MODIFIED", "n1") == 1  # the second write only
        assert informer.objects["n1"]["metadata"]["labels"]["c"] == "d"


async def test_a_410_lists_again_and_watches_from_the_new_list() -> None:
    async with api_with(["n1"]) as (fake, api), informing(api) as (informer, heard):
        held = fake.hold("GET", PATH)  # the watch resumed after the clean end
        fake.end_watches()
        await held.reached.wait()
        fake.put_object(COLL, node("n2"))
        fake.compact()  # where the watch resumes from is history now: 410
        held.release.set()

        async def relisted() -> bool:
            return informer.lists == 2 and heard.saw("ADDED", "n2") == 1

        await eventually(relisted)
        assert fake.lists[COLL] == 2
        fake.put_object(COLL, node("n3"))  # and the new watch goes on

        async def n3() -> bool:
            return heard.saw("ADDED", "n3") == 1

        await eventually(n3)
        assert heard.changes == [("ADDED", "n1"), ("ADDED", "n2"), ("ADDED", "n3")]


async def test_a_failed_watch_lists_again_and_reports_the_nodes_deleted_meanwhile() -> None:
    async with api_with(["n1", "n2"]) as (fake, api), informing(api) as (informer, heard):
        held = fake.hold("GET", PATH)  # the watch resumed after the stream ended
        fake.end_watches()
        await held.reached.wait()
        fake.remove(COLL, "n2")  # no watch will see this
        fake.put_object(COLL, node("n3"))
        fake.fail_next("GET", PATH, 500)  # the resumed watch fails: list again
        held.release.set()

        async def relisted() -> bool:
            return informer.lists == 2

        await eventually(relisted)
        assert heard.changes[:2] == [("ADDED", "n1"), ("ADDED", "n2")]
        assert sorted(heard.changes[2:]) == [("ADDED", "n3"), ("DELETED", "n2")]  # n1: as it was
        assert set(informer.objects) == {"n1", "n3"} and fake.lists[COLL] == 2


async def test_an_event_older_than_a_write_it_was_told_changes_nothing() -> None:
    """The watch lags behind this process's writes: events from before the write are old news."""
    async with api_with(["n1"]) as (fake, api), informing(api) as (informer, heard):
        ref = Ref(resource=NODES, name="n1")
        older = await api.patch(ref, {"metadata": {"labels": {"step": "1"}}})
        newer = await api.patch(ref, {"metadata": {"labels": {"step": "2"}}})
        informer.put(newer)
        told = heard.saw("MODIFIED", "n1")  # the watch may have delivered the first already
        informer.put(older)  # an answer older than what is held: ignored
        informer.apply("MODIFIED", older)  # as if the watch delivered it only now
        assert informer.objects["n1"]["metadata"]["labels"]["step"] == "2"
        fake.put_object(COLL, node("n2"))  # after both writes' echoes in the stream

        async def n2() -> bool:
            return heard.saw("ADDED", "n2") == 1

        await eventually(n2)
        assert heard.saw("MODIFIED", "n1") == told
        assert informer.objects["n1"]["metadata"]["labels"]["step"] == "2"
        later = {**newer, "metadata": {**newer["metadata"], "resourceVersion": "999"}}
        informer.apply("MODIFIED", later)
        assert heard.saw("MODIFIED", "n1") == told + 1
