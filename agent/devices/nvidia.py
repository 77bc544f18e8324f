"""NVIDIA detection and sampling: the PCI check, then NVML, one session per pass.

How failures are contained (one card never takes the others down):

- a field NVML does not offer (:class:`~agent.devices.libs.nvml.NvmlUnsupported`) is left out;
- any other failure of an optional call costs that field and logs a WARNING;
- a card that answers ``GPU_IS_LOST`` is not asked anything more this pass; it is reported
  ``unhealthy`` with what was read before the loss, if its UUID was read (or an earlier pass of
  this backend read it), and left out with a WARNING otherwise;
- a card whose handle or UUID cannot be read is left out with a WARNING;
- only NVML as a whole failing (init with cards on the bus, the driver version, the device
  count) raises :class:`DetectionError`, because then no card can be trusted.

Unit conversions truncate, as the reference does: bytes ``>> 20`` to MiB, mW ``// 1000`` to W, so
a reported figure never exceeds what was measured. Percentages are rounded half up.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from typing import Any, TypeVar

from agent.devices import pci
from agent.devices.gpm import Activity, GpmSampler
from agent.devices.hostfs import HostFS
from agent.devices.libs.nvml import (
    Handle,
    Nvml,
    NvmlError,
    NvmlGpuLost,
    NvmlUnavailable,
    NvmlUnsupported,
)
from agent.devices.manufacturers import MANUFACTURERS
from agent.devices.nvidia_facts import MANUFACTURER, CardFacts, build_groups, pct
from agent.errors import DetectionError
from bus import devices

log = logging.getLogger(__name__)

T = TypeVar("T")

# -- the backend --------------------------------------------------------------------------------


class _CardReader:
    """Reads optional values of one card, and stops asking once the card is lost."""

    def __init__(self, handle: Handle, label: str) -> None:
        self.handle = handle
        self.label = label
        self.lost = False

    def get(self, call: Callable[[Handle], T]) -> T | None:
        if self.lost:
            return None
        try:
            return call(self.handle)
        except NvmlUnsupported:
            return None
        except NvmlGpuLost as e:
            self.lost = True
            log.warning("NVIDIA %s is lost (%s); reporting it unhealthy", self.label, e)
        except NvmlError as e:  # any other failure, a driver unloading mid-pass included
            log.warning("NVIDIA %s: %s; leaving the field out", self.label, e)
        return None


class NvidiaBackend:
    """:class:`agent.devices.detection.Backend` for NVIDIA, over NVML (real or simulated)."""

    manufacturer = MANUFACTURER

    def __init__(
        self,
        *,
        host: HostFS,
        nvml: Nvml,
        pci_check: bool = True,
        simulated: bool = False,
        gpm: GpmSampler | None = None,
    ) -> None:
        self.host = host
        self.nvml = nvml
        self.pci_check = pci_check
        self.simulated = simulated
        self.gpm = gpm if gpm is not None else GpmSampler(nvml)
        """Monitor state between passes: the previous GPM sample of each card and GI."""
        self._last_seen: dict[int, CardFacts] = {}
        """Each NVML index's card as last read, to report it unhealthy if it is lost unread."""

    def detect(self) -> list[devices.DeviceGroup]:
        return self._pass(self._detect) or []

    def sample(self) -> list[devices.AcceleratorSample]:
        return self._pass(self._sample) or []

    def prime(self) -> bool:
        """Take a first GPM sample of every card, so that the next pass has rates.

        For a one-shot ``dm monitor``, which makes a single pass; True when a sample was taken
        (wait :data:`agent.devices.gpm.MIN_INTERVAL_S` before sampling). Never raises: what
        fails here fails again, and is reported, in the pass that follows.
        """
        try:
            return bool(self._pass(self._prime))
        except DetectionError:
            return False

    def _prime(self, _functions: dict[str, pci.PciFunction]) -> list[str]:
        """The UUIDs of the cards a first GPM sample was taken of."""
        count = self._system(self.nvml.device_count, optional=False) or 0
        primed = []
        for index in range(count):
            identified = self._identify(index)
            if not isinstance(identified, tuple):
                continue
            handle, uuid = identified
            reader = _CardReader(handle, f"card {index} ({uuid})")
            reader.get(functools.partial(self.gpm.card, uuid=uuid))
            if reader.get(functools.partial(self.gpm.supported, uuid=uuid)):  # known: no call
                primed.append(uuid)
        return primed

    def close(self) -> None:
        """Free the GPM sample buffers (inside a session of its own; a failed init leaks them)."""
        if not self.gpm.held():
            return
        try:
            with self.nvml.session():
                self.gpm.close()
        except NvmlError as e:
            log.debug("NVML unavailable to free GPM samples: %s", e)

    # -- one pass -----------------------------------------------------------------------------

    def _pass(self, body: Callable[[dict[str, pci.PciFunction]], list[T]]) -> list[T] | None:
        """PCI check, then one NVML session around ``body``; None when there is nothing here."""
        functions: dict[str, pci.PciFunction] = {}
        if self.pci_check:
            functions = {f.bdf: f for f in pci.scan(self.host, MANUFACTURERS["nvidia"].pci_vendor)}
            if not functions:
                log.debug("no NVIDIA PCI device; NVML not loaded")
                return None
        with ExitStack() as stack:
            try:
                stack.enter_context(self.nvml.session())
            except NvmlError as e:
                self._init_failed(len(functions), e)
                return None
            return body(functions)

    def _init_failed(self, found: int, e: NvmlError) -> None:
        """Raise unless NVML is simply absent and no card on the bus says it should be here."""
        if found:
            plural = "device" if found == 1 else "devices"
            message = f"{found} NVIDIA PCI {plural} found but NVML failed to initialise: {e.detail}"
            raise DetectionError(MANUFACTURER, message) from e
        if isinstance(e, NvmlUnavailable):
            log.info("NVML is not available (%s); no NVIDIA accelerator detected", e.detail)
            return
        raise DetectionError(MANUFACTURER, f"NVML failed to initialise: {e.detail}") from e

    def _system(self, call: Callable[[], T], *, optional: bool) -> T | None:
        """A host-wide NVML value; only an optional one may be unsupported, all else is fatal."""
        try:
            return call()
        except NvmlError as e:
            if optional and isinstance(e, NvmlUnsupported):
                return None
            raise DetectionError(MANUFACTURER, f"NVML {e}") from e

    def _detect(self, functions: dict[str, pci.PciFunction]) -> list[devices.DeviceGroup]:
        driver = self._system(self.nvml.driver_version, optional=True)
        cuda = self._system(self.nvml.cuda_driver_version, optional=True)
        count = self._system(self.nvml.device_count, optional=False) or 0
        cards = [c for i in range(count) if (c := self._read_card(i, functions)) is not None]
        return build_groups(
            cards, driver_version=driver, cuda_driver_version=cuda, simulated=self.simulated
        )

    # -- one card -----------------------------------------------------------------------------

    def _identify(self, index: int) -> tuple[Handle, str] | CardFacts | None:
        """The card's handle and UUID; else what an earlier pass knew if it is lost, else None."""
        try:
            handle = self.nvml.handle(index)
            return handle, self.nvml.uuid(handle)
        except NvmlError as e:
            known = self._last_seen.get(index)
            if isinstance(e, NvmlGpuLost) and known is not None:
                log.warning("NVIDIA card %d (%s) is lost (%s); reporting it unhealthy",
                            index, known.uuid, e)  # fmt: skip
                return replace(known, lost=True)
            log.warning("NVIDIA card %d cannot be identified (%s); leaving it out", index, e)
            return None

    def _read_card(self, index: int, functions: dict[str, pci.PciFunction]) -> CardFacts | None:
        identified = self._identify(index)
        if not isinstance(identified, tuple):
            return identified
        handle, uuid = identified
        card = CardFacts(index=index, uuid=uuid)
        reader = _CardReader(handle, f"card {index} ({uuid})")
        card.bus_id = reader.get(self.nvml.pci_bus_id)
        if card.bus_id:
            reader.label = f"card {index} ({uuid}, {card.bus_id})"
        card.minor = reader.get(self.nvml.minor_number)
        card.name = reader.get(self.nvml.name)
        memory = reader.get(self.nvml.memory)
        card.memory_bytes = memory[0] if memory else None
        card.cuda_cores = reader.get(self.nvml.num_cores)
        card.capability = reader.get(self.nvml.compute_capability)
        card.architecture = reader.get(self.nvml.architecture)
        card.mig_mode = reader.get(self.nvml.mig_mode)
        if card.mig_mode:
            card.mig_profiles = reader.get(self.nvml.gpu_instance_profiles)
        self._read_locality(card, reader, functions)
        card.lost = reader.lost
        if not card.lost:
            self._last_seen[index] = card
        return card

    def _read_locality(
        self, card: CardFacts, reader: _CardReader, functions: dict[str, pci.PciFunction]
    ) -> None:
        """Bridges, NUMA node and CPUs from sysfs; NVML's affinity masks where sysfs is silent."""
        function = None
        if card.bus_id:
            function = functions.get(card.bus_id) or pci.read_function(self.host, card.bus_id)
        if function is not None:
            card.bridges = function.bridges
            card.numa = str(function.numa_node) if function.numa_node is not None else None
            card.cpus = function.cpu_list
        if card.numa is None:
            nodes = reader.get(self.nvml.memory_affinity)
            card.numa = pci.format_cpu_list(nodes) if nodes else None
        if card.cpus is None:
            cpus = reader.get(self.nvml.cpu_affinity)
            card.cpus = pci.format_cpu_list(cpus) if cpus else None

    # -- sampling -----------------------------------------------------------------------------

    def _sample(self, _functions: dict[str, pci.PciFunction]) -> list[devices.AcceleratorSample]:
        count = self._system(self.nvml.device_count, optional=False) or 0
        try:
            return [s for i in range(count) if (s := self._sample_card(i)) is not None]
        finally:
            self.gpm.prune()  # free the samples of instances and cards no longer here

    def _sample_card(self, index: int) -> devices.AcceleratorSample | None:
        identified = self._identify(index)
        if not isinstance(identified, tuple):
            return (
                devices.AcceleratorSample(id=identified.uuid, unhealthy=True)
                if identified
                else None
            )
        handle, uuid = identified
        known = self._last_seen.get(index)
        if known is None or known.uuid != uuid:
            self._last_seen[index] = CardFacts(index=index, uuid=uuid)
            if known is not None:
                self.gpm.forget([known.uuid])
        reader = _CardReader(handle, f"card {index} ({uuid})")
        memory = reader.get(self.nvml.memory_info)
        utilization = reader.get(self.nvml.utilization)
        temperature = reader.get(self.nvml.temperature)
        power_mw = reader.get(self.nvml.power_usage)
        total, used = (memory.total, memory.used) if memory else (None, None)
        extra = self._telemetry(reader, self._last_seen.get(index))
        extra.update(_activity_fields(reader.get(functools.partial(self.gpm.card, uuid=uuid))))
        return devices.AcceleratorSample(
            id=uuid,
            memory=total >> 20 if total is not None else None,
            memory_usage=used >> 20 if used is not None else None,
            memory_utilization=pct(used, total) if total is not None and used is not None else None,
            cores_utilization=utilization,
            temperature=temperature,
            power_usage=power_mw // 1000 if power_mw is not None else None,
            unhealthy=reader.lost,
            memory_free=memory.free >> 20 if memory else None,
            memory_reserved=memory.reserved >> 20
            if memory and memory.reserved is not None
            else None,
            **extra,
        )

    def _telemetry(self, reader: _CardReader, known: CardFacts | None) -> dict[str, Any]:
        """The DCGM exporter's default fields NVML gives (absent where the card has none)."""
        nvml = self.nvml
        pcie = reader.get(nvml.pcie_throughput)
        rows = reader.get(nvml.remapped_rows)
        retired = reader.get(nvml.retired_pages)
        links = reader.get(nvml.nvlink_links_up)
        nvlink = reader.get(nvml.nvlink_data) if links else None
        return {
            "memory_copy_utilization": reader.get(nvml.memory_copy_utilization),
            "encoder_utilization": reader.get(nvml.encoder_utilization),
            "decoder_utilization": reader.get(nvml.decoder_utilization),
            "memory_temperature": reader.get(nvml.memory_temperature),
            "sm_clock": reader.get(nvml.sm_clock),
            "memory_clock": reader.get(nvml.memory_clock),
            "energy": reader.get(nvml.total_energy),
            "pcie_tx_throughput": pcie[0] if pcie else None,
            "pcie_rx_throughput": pcie[1] if pcie else None,
            "pcie_replays": reader.get(nvml.pcie_replays),
            "remapped_rows_correctable": rows[0] if rows else None,
            "remapped_rows_uncorrectable": rows[1] if rows else None,
            "row_remap_failed": rows[2] if rows else None,
            "retired_pages_single_bit": retired[0] if retired else None,
            "retired_pages_double_bit": retired[1] if retired else None,
            "nvlink_links": links,
            "nvlink_tx": nvlink[0] if nvlink else None,
            "nvlink_rx": nvlink[1] if nvlink else None,
            "mig_instances": self._mig_instances(reader, known),
        }

    def _mig_instances(
        self, reader: _CardReader, known: CardFacts | None
    ) -> tuple[devices.MigInstanceSample, ...] | None:
        """Each MIG device of a card in MIG mode, with its GPU-instance profile and memory."""
        if known is None or not known.mig_mode:
            return None
        found = reader.get(self.nvml.mig_devices)
        if found is None:
            return None
        profiles: dict[int, str] = {}
        activities: dict[int, Activity | None] = {}
        for profile in known.mig_profiles or ():
            instances = reader.get(
                functools.partial(
                    self.nvml.gpu_instances,
                    profile_id=profile.index,
                    capacity=profile.instance_count,
                )
            )
            profiles.update({gi.id: profile.name for gi in instances or ()})
        out = []
        for mig in found:
            memory = _CardReader(mig.handle, reader.label).get(self.nvml.memory_info)
            gi, name = mig.gpu_instance_id, profiles.get(mig.gpu_instance_id)
            if gi not in activities:  # one GPM sample per GI, however many CIs it holds
                activities[gi] = reader.get(
                    functools.partial(
                        self.gpm.instance, uuid=known.uuid, gpu_instance_id=gi, profile=name
                    )
                )
            out.append(
                devices.MigInstanceSample(
                    uuid=mig.uuid,
                    gpu_instance_id=gi,
                    compute_instance_id=mig.compute_instance_id,
                    profile=name,
                    memory=memory.total >> 20 if memory else None,
                    memory_usage=memory.used >> 20 if memory else None,
                    **_activity_fields(activities[gi]),
                )
            )
        return tuple(out)


def _activity_fields(activity: Activity | None) -> dict[str, float | None]:
    """GPM activity as sample fields (all None without GPM or on a first pass)."""
    a = activity or Activity()
    return {
        "gr_engine_active": a.gr_engine_active,
        "sm_active": a.sm_active,
        "sm_occupancy": a.sm_occupancy,
        "dram_active": a.dram_active,
        "tensor_active": a.tensor_active,
    }
