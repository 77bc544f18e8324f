"""The driver controls ``dm serve`` registers: the driver steps some vendors' grants need.

A :class:`injection.DriverStep` names a change to a card's driver state that must hold before a
container starts (:mod:`agent.deviceplugin.vendors`). :class:`injecting.Injector` performs each
step through the control registered for its kind and refuses the grant when none is, so a
control exists here only where the vendor documents a call that makes the change:

- ``ascend-container-share``: DCMI's ``dcmi_set_device_share_enable``, through the Ascend
  backend's own reader (so a ``--simulate`` run changes the simulated chip it detects);
- ``cambricon-smlu`` and ``metax-sgpu`` have no control: see ``docs/injection.md`` for why.

A control is synchronous (:data:`injecting.DriverControl`): the node calls it on the loop thread
between an Allocate's decision and its charge, and that section must not interleave with another
Allocate. The DCMI calls it makes are two ioctls on a local device node, short enough for that.
A control maps every library error to :class:`errors.ActuationFailed`, so the grant fails with
``Internal`` and nothing is charged.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence

from agent.deviceplugin import errors
from agent.deviceplugin.injecting import DriverControl
from agent.deviceplugin.injection import DriverStep
from agent.deviceplugin.vendors.ascend import CONTAINER_SHARE
from agent.devices import ascend, detection, vendor
from agent.devices.libs import clib

log = logging.getLogger(__name__)


def parameter(step: DriverStep, name: str) -> int:
    """The step's integer parameter ``name``.

    :raises errors.ActuationFailed: the step lacks it or it is not a number (a responder bug,
        reported as the grant's failure rather than a crash).
    """
    value = dict(step.parameters).get(name, "")
    if not value.isdigit():
        raise errors.ActuationFailed(f"{step.describe()}: no usable {name} parameter")
    return int(value)


class AscendContainerShare:
    """``ascend-container-share``: the chip's container-share flag on, through DCMI.

    ``reader`` returns the Ascend reader (made on first need, so a node whose DCMI cannot be
    loaded still serves exclusive grants, and only share-needing ones fail).
    """

    def __init__(self, reader: Callable[[], ascend.AscendReader]) -> None:
        self._reader = reader

    def __call__(self, step: DriverStep) -> None:
        physical = parameter(step, "physical-id")
        try:
            changed = self._reader().share_container(physical)
        except clib.LibError as e:
            raise errors.ActuationFailed(f"{step.describe()}: {e}") from e
        if changed:
            log.info("turned the container-share flag on for %s", step.describe())


def _ascend_reader(backend: vendor.VendorBackend) -> ascend.AscendReader:
    """The backend's reader; :raises clib.LibUnavailable: DCMI cannot be loaded."""
    reader = backend.reader()
    if not isinstance(reader, ascend.AscendReader):  # pragma: no cover - a wiring bug
        raise TypeError(f"the ascend backend reads through {type(reader).__name__}")
    return reader


def driver_controls(backends: Sequence[detection.Backend]) -> dict[str, DriverControl]:
    """The controls for the manufacturers this node serves, by step kind."""
    controls: dict[str, DriverControl] = {}
    for backend in backends:
        if isinstance(backend, vendor.VendorBackend) and backend.manufacturer == "ascend":
            controls[CONTAINER_SHARE] = AscendContainerShare(
                functools.partial(_ascend_reader, backend)
            )
    return controls
