"""Client of kubelet's pod-resources API: which container holds which device ids.

Allocate carries no pod identity, so this is how holdings get their pod and container names, and
how finished containers are noticed (kubelet never tells a device plugin a container ended).
"""

from __future__ import annotations

from grpclib.client import Channel
from grpclib.exceptions import GRPCError, StreamTerminatedError

from agent.deviceplugin import errors
from agent.deviceplugin.holdings import LiveContainer
from proto.podresources import v1 as podresources


class PodResourcesUnavailable(errors.DevicePluginError):
    """kubelet's pod-resources socket did not answer; the ledger is left as it is."""


async def _list(path: str, timeout_s: float) -> podresources.ListPodResourcesResponse:
    channel = Channel(path=path)
    try:
        stub = podresources.PodResourcesListerStub(channel)
        return await stub.list(podresources.ListPodResourcesRequest(), timeout=timeout_s)
    except (GRPCError, StreamTerminatedError, OSError, TimeoutError) as e:
        raise PodResourcesUnavailable(f"pod-resources at {path}: {e}") from e
    finally:
        channel.close()


async def list_containers(
    path: str, *, timeout_s: float
) -> dict[tuple[str, str, str], frozenset[str]]:
    """Every container kubelet lists, ``(namespace, pod, container)``, with the resources it
    holds device ids of: one listed without a device of a resource may be the one kubelet is
    allocating that resource for (§3.5 step 3, "identify by kubelet").

    :raises PodResourcesUnavailable: the socket is missing or the call failed.
    """
    reply = await _list(path, timeout_s)
    return {
        (pod.namespace, pod.name, container.name): frozenset(
            d.resource_name for d in container.devices if d.device_ids
        )
        for pod in reply.pod_resources
        for container in pod.containers
    }


async def list_live(path: str, *, timeout_s: float) -> list[LiveContainer]:
    """Every (container, resource) with device ids, as kubelet reports them now.

    :raises PodResourcesUnavailable: the socket is missing or the call failed.
    """
    reply = await _list(path, timeout_s)
    return [
        LiveContainer(
            namespace=pod.namespace,
            pod=pod.name,
            container=container.name,
            resource=devices.resource_name,
            device_ids=tuple(devices.device_ids),
        )
        for pod in reply.pod_resources
        for container in pod.containers
        for devices in container.devices
        if devices.device_ids
    ]
