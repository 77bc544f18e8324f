"""The one apply engine at its boundary: plans by the one key rule, written by the one executor
into the stateful fake API (optimistic concurrency, merge patches as the API server applies
them), on both paths that use it (the chain's converging, a node reconciler's whole-owned status).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from controlplane_fakeapi import FakeApi, fake_api

from controlplane import errors
from controlplane.chain import converging, naming
from controlplane.chain.deciding import Cache
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.reconciling import applying
from controlplane.reconciling.planning import Desired, Patch, plan
from controlplane.reconciling.sinks import KubeSink
from controlplane.resources import DEVICES, Observed, Ref

pytestmark = pytest.mark.anyio
CQS = f"apis/{naming.KUEUE_GROUP}/{naming.KUEUE_VERSION}/clusterqueues"
DEVS = "apis/worker.gpustack.ai/v1alpha1/devices"
OURS = {"app.kubernetes.io/part-of": "gpustack-operator"}


@asynccontextmanager
async def sink() -> AsyncIterator[tuple[FakeApi, KubeSink]]:
    async with (
        fake_api() as (fake, url),
        open_client(KubeSettings.for_tests(url, backoff_s=0.01)) as api,
    ):
        yield fake, KubeSink(api)


def queue(spec: dict[str, Any]) -> Desired:
    return Desired(metadata={"labels": OURS}, spec=spec)


async def test_the_chain_leaves_a_server_default_alone_and_patches_only_what_it_names() -> None:
    ref = Ref(resource=naming.CLUSTERQUEUES, name="gpustack-q")
    async with sink() as (fake, kube):
        cache: Cache = {}
        await converging.converge_set(kube, naming.CLUSTERQUEUES, {ref: queue({"cohort": "a"})},
                                      cache)  # fmt: skip
        stored = fake.get(CQS, "gpustack-q")
        stored["spec"]["queueingStrategy"] = "BestEffortFIFO"  # as Kueue's defaulting sets it
        cache[naming.CLUSTERQUEUES][ref] = stored
        writes = fake.object_writes[(CQS, None, "gpustack-q")]
        await converging.converge_set(kube, naming.CLUSTERQUEUES, {ref: queue({"cohort": "a"})},
                                      cache)  # fmt: skip
        assert fake.object_writes[(CQS, None, "gpustack-q")] == writes  # no fight, no write
        await converging.converge_set(kube, naming.CLUSTERQUEUES, {ref: queue({"cohort": "b"})},
                                      cache)  # fmt: skip
        spec = fake.get(CQS, "gpustack-q")["spec"]
        assert spec == {"cohort": "b", "queueingStrategy": "BestEffortFIFO"}
        assert cache[naming.CLUSTERQUEUES][ref]["spec"] == spec  # the cache is what was written
        await converging.converge_set(kube, naming.CLUSTERQUEUES, {}, cache)
        assert (CQS, None, "gpustack-q") not in fake.objects and cache[naming.CLUSTERQUEUES] == {}


async def test_a_whole_owned_status_loses_the_keys_it_no_longer_names() -> None:
    ref = Ref(resource=DEVICES, name="n")
    whole = Desired(spec={"groups": []}, status={"summary": {"accelerators": 1}, "gone": "x"},
                    whole=frozenset({"spec", "status"}))  # fmt: skip
    async with sink() as (fake, kube):
        made = await applying.apply_all(kube, plan(ref, whole, None), None)
        assert made is not None and fake.get(DEVS, "n")["status"]["gone"] == "x"
        later = Desired(spec={"groups": []}, status={"summary": {"accelerators": 2}},
                        whole=frozenset({"spec", "status"}))  # fmt: skip
        written = await applying.apply_all(kube, plan(ref, later, made), made)
        assert fake.get(DEVS, "n")["status"] == {"summary": {"accelerators": 2}}
        assert written is not None and written.body["status"] == {"summary": {"accelerators": 2}}


async def test_a_stale_plan_is_a_conflict_and_a_racing_create_is_adopted() -> None:
    ref = Ref(resource=naming.CLUSTERQUEUES, name="gpustack-q")
    async with sink() as (fake, kube):
        made = await converging.write(kube, ref, queue({"cohort": "a"}), None)
        fake.get(CQS, "gpustack-q")["metadata"]["resourceVersion"] = "999"  # someone wrote
        stale = Observed.of(made)
        with pytest.raises(errors.Conflict):
            await applying.apply(kube, Patch(ref=ref, body={"spec": {"cohort": "b"}}), stale)
        adopted = await converging.write(kube, ref, queue({"cohort": "c"}), None)  # exists
        assert adopted["spec"] == {"cohort": "a"}  # the next pass patches it
