"""Hand-made device groups of the seven other manufacturers, as detection reports them, and a
device-plugin session that allocates through grpcio against our servers.

Built by hand (detection for these vendors is another module's): one group per call, cards
numbered 0..n-1, ``logicalSliced.count`` from the manufacturers table unless the card is in
partition mode.

A visibility request (the SSH sidecar's) only mirrors its Pod's owner, so a test of one gives the
session the worker's pending claims of that Pod (:func:`sidecar_pod`): kubelet's pod-resources
then lists the Pod's containers holding nothing yet (it is admitting them), which is how the
owner's exclusive or shared Allocate is named and the sidecar's matched.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path

import anyio.to_thread

from agent.deviceplugin.resources import Mode, resource_name
from agent.deviceplugin.running import Plugins, device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from agent.devices.manufacturers import MANUFACTURERS
from agent.testing import FakeKubelet, unary
from bus import devices, events
from bus.records import PendingContainer
from proto.deviceplugin import v1beta1 as dp
from proto.podresources import v1 as podresources


def group(
    manufacturer: str,
    group_id: str,
    *,
    cards: int = 2,
    memory: int = 65536,
    cores: int | None = None,
    family: str | None = None,
    runtime_version: str | None = None,
    physical: Callable[[int], tuple[int, ...]] | None = None,
    partitions: int = 0,
) -> devices.DeviceGroup:
    """``cards`` accelerators ``<MFR>-<i>``, bus ``0000:<i+1>:00.0``, NUMA node ``i // 4``."""
    slices = MANUFACTURERS[manufacturer].logical_slices
    accelerators = tuple(
        devices.Accelerator(
            id=f"{manufacturer.upper()}-{i:02d}",
            index=i,
            physical_indexes=physical(i) if physical else None,
            topology=devices.Topology(
                pci_bus_id=f"0000:{i + 1:02x}:00.0", numa_affinity=str(i // 4)
            ),
            status=devices.AcceleratorStatus(
                unhealthy=False,
                logical_sliced=None
                if partitions
                else devices.LogicalSliced(cores_percentage_overcommit=False, count=slices),
                physical_sliced=devices.PhysicalSliced(count=partitions) if partitions else None,
            ),
        )
        for i in range(cards)
    )
    return devices.DeviceGroup(
        id=group_id,
        manufacturer=manufacturer,
        name=group_id,
        memory=memory,
        cores=cores,
        family=family,
        runtime_version=runtime_version,
        accelerators=accelerators,
    )


def resources_of(manufacturer: str, *, partitioned: bool = False) -> list[str]:
    """What kubelet must see registered for ``manufacturer`` (spelled out: the contract)."""
    base = MANUFACTURERS[manufacturer].resource
    names = [base, f"{base}.shared", f"{base}.sliced"]
    names += [f"{base}.partitioned"] if partitioned else []
    return [*names, f"device.gpustack.ai/{manufacturer}.visibility"]


def token(g: devices.DeviceGroup, card: int, index: int = 0) -> str:
    return f"{g.id}:{g.accelerators[card].id}:{index:04d}"


def sidecar_pod(
    manufacturer: str,
    owner: Mode,
    count: int,
    *,
    pod: str = "s",
    units: int = 0,
    memory_percentage: int | None = None,
    cores_percentage: int | None = None,
) -> list[PendingContainer]:
    """The worker's claims of Pod ``pod``: ``main`` asks for ``count`` devices in mode
    ``owner`` (a sliced one with its own units and caps), and its ``ssh`` sidecar asks to see
    as many cards (``device.gpustack.ai/<mfr>.visibility: count``)."""
    who = {"pod_uid": f"uid-{pod}", "namespace": "ns", "pod": pod}
    created = datetime(2026, 1, 1, tzinfo=UTC)
    main = PendingContainer(
        **who, container="main", resource=resource_name(manufacturer, owner), count=count,
        units=units, memory_percentage=memory_percentage, cores_percentage=cores_percentage,
        created_at=created,
    )  # fmt: skip
    ssh = PendingContainer(
        **who, container="ssh", resource=resource_name(manufacturer, "visibility"), count=count,
        units=0, created_at=created,
    )  # fmt: skip
    return [main, ssh]


def admitting(claims: Sequence[PendingContainer]) -> list[podresources.PodResources]:
    """kubelet's pod-resources list while it admits the claims' Pods: every container listed,
    none holding a device yet."""
    pods: dict[tuple[str, str], list[str]] = {}
    for c in claims:
        names = pods.setdefault((c.namespace, c.pod), [])
        if c.container not in names:
            names.append(c.container)
    return [
        podresources.PodResources(
            name=pod,
            namespace=namespace,
            containers=[podresources.ContainerResources(name=n) for n in names],
        )
        for (namespace, pod), names in pods.items()
    ]


class Session:
    """Allocate over the sockets of one node's plugins, as kubelet does."""

    def __init__(self, directory: Path, plugins: Plugins, published: list[events.Event]) -> None:
        self.directory = directory
        self.plugins = plugins
        self.published = published

    async def allocate(
        self, manufacturer: str, mode: str, ids: Sequence[str]
    ) -> dp.ContainerAllocateResponse:
        request = dp.AllocateRequest(
            container_requests=[dp.ContainerAllocateRequest(devices_ids=list(ids))]
        )
        reply = await anyio.to_thread.run_sync(
            unary,
            self.directory / f"{manufacturer}.{mode}.sock",
            "/v1beta1.DevicePlugin/Allocate",
            request,
            dp.AllocateResponse.FromString,
        )
        (container,) = reply.container_responses
        return container


@asynccontextmanager
async def session(
    directory: Path,
    kubelet: FakeKubelet,
    groups: Sequence[devices.DeviceGroup],
    *,
    pending: Sequence[PendingContainer] = (),
    **kw: object,
) -> AsyncIterator[Session]:
    """Plugins for ``groups`` registered with ``kubelet``, work directories under ``directory``.

    ``pending``: the worker's pending claims of this node; given any, kubelet also serves
    pod-resources, listing the claims' containers as it does while admitting them.
    """
    published: list[events.Event] = []
    controls = kw.pop("controls", None)
    if pending:
        socket = directory / "pod-resources.sock"
        kubelet.serve_pod_resources(socket)
        kubelet.live = admitting(pending)
        kw.setdefault("pod_resources_socket", str(socket))
    claims = tuple(pending)
    settings = DevicePluginSettings.for_tests(str(directory), **kw)
    async with device_plugins(
        settings,
        publish=published.append,
        pending=lambda: claims,
        controls=controls,  # type: ignore[arg-type]
    ) as plugins:
        plugins.update(groups)
        expected = [
            r
            for g in groups
            for r in resources_of(g.manufacturer, partitioned=g.manufacturer in ("hygon", "thead"))
        ]
        await kubelet.registered_all(sorted(set(expected)))
        yield Session(directory, plugins, published)


def mounts(response: dp.ContainerAllocateResponse) -> dict[str, tuple[str, bool]]:
    return {m.container_path: (m.host_path, m.read_only) for m in response.mounts}


def nodes(response: dp.ContainerAllocateResponse) -> list[tuple[str, str, str]]:
    return [(d.container_path, d.host_path, d.permissions) for d in response.devices]
