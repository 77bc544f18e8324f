"""Allocate and GetPreferredAllocation decisions, and each vendor's injection: no event loop."""

from __future__ import annotations

import pytest

from agent.deviceplugin import allocation, errors, resources, responders
from agent.deviceplugin.ledger import Ledger
from bus import devices
from proto.deviceplugin import v1beta1 as dp

LIB = "/var/lib/gpustack/operator/lib"


def _view(
    groups: list[devices.DeviceGroup],
    mode: resources.Mode,
    book: Ledger | None = None,
) -> allocation.View:
    cards = resources.cards_of(groups)
    held = book.held_modes() if book else {}
    specs = resources.plan_servers(cards, held_modes=held)
    spec = specs[(groups[0].manufacturer, mode)]
    return allocation.View(
        mode=mode, resource=spec.resource, tokens={t.id: t for t in spec.tokens}, cards=cards
    )


def _ids(view: allocation.View, card: int, *indexes: int) -> list[str]:
    by = {(view.cards[t.card].index, t.index): t.id for t in view.tokens.values()}
    return [by[(card, i)] for i in indexes]


def _grant(view: allocation.View, ids: list[str], book: Ledger | None = None) -> allocation.Grant:
    book = book if book is not None else Ledger()
    grant = allocation.decide(view, ids, book, now=0.0)
    if grant.holding is not None:
        book.charge(grant.holding)
    return grant


# ------------------------------------------------------------------ decide


@pytest.mark.parametrize("bad", ["nope", "a:b:1", "x" * 70 + ":y:0000", ""])
def test_malformed_ids_are_bad_requests(h200: list[devices.DeviceGroup], bad: str) -> None:
    with pytest.raises(errors.BadRequest, match="malformed"):
        allocation.decide(_view(h200, "exclusive"), [bad], Ledger(), now=0)


def test_unknown_ids_are_bad_requests(h200: list[devices.DeviceGroup]) -> None:
    with pytest.raises(errors.BadRequest, match="unknown device id 'nvidia-h200:GPU-x:0000'"):
        allocation.decide(_view(h200, "exclusive"), ["nvidia-h200:GPU-x:0000"], Ledger(), now=0)


def test_cross_mode_is_refused_and_names_the_card_and_both_modes(
    h200: list[devices.DeviceGroup],
) -> None:
    book = Ledger()
    exclusive = _view(h200, "exclusive")
    _grant(exclusive, _ids(exclusive, 0, 0), book)
    card = h200[0].accelerators[0].id

    with pytest.raises(errors.Conflict) as caught:
        _grant(
            _view(h200, "sliced", book),
            _ids(_view(h200, "sliced"), 0, 0),
            book,
        )

    assert str(caught.value) == (
        f"card {card} (nvidia-h200 #0) is held in exclusive mode, cannot allocate it in sliced mode"
    )


def test_two_shared_tokens_on_one_card_are_refused(h200: list[devices.DeviceGroup]) -> None:
    view = _view(h200, "shared")

    with pytest.raises(errors.Conflict, match="named twice"):
        _grant(view, _ids(view, 0, 0, 1))


def test_a_retry_of_the_same_ids_charges_once(h200: list[devices.DeviceGroup]) -> None:
    book = Ledger()
    view = _view(h200, "sliced")
    ids = _ids(view, 0, 0, 1)

    first = _grant(view, ids, book)
    second = allocation.decide(view, ids, book, now=1.0)

    assert second.holding == first.holding
    assert book.used(h200[0].accelerators[0].id) == 2 * 12_500


def test_sliced_share_is_the_token_count(h200: list[devices.DeviceGroup]) -> None:
    book = Ledger()
    view = _view(h200, "sliced")

    grant = _grant(view, _ids(view, 3, 0, 1, 2, 3), book)

    assert grant.holding is not None
    assert grant.holding.charges == ((h200[0].accelerators[3].id, 4 * 12_500),)


# ------------------------------------------------------------------ prefer


def test_exclusive_preference_stays_on_one_numa_node(h200: list[devices.DeviceGroup]) -> None:
    view = _view(h200, "exclusive")
    # offer cards 2..7: node 0 has 2 free, node 1 has 4 free; a request of 3 fits node 1 only
    available = [i for c in range(2, 8) for i in _ids(view, c, 0)]

    chosen = allocation.prefer(view, Ledger(), available=available, must_include=[], size=3)

    assert [view.cards[view.tokens[i].card].index for i in chosen] == [4, 5, 6]


def test_exclusive_preference_follows_the_must_include_node(
    h200: list[devices.DeviceGroup],
) -> None:
    view = _view(h200, "exclusive")
    available = [i for c in range(8) for i in _ids(view, c, 0)]
    must = _ids(view, 5, 0)

    chosen = allocation.prefer(view, Ledger(), available=available, must_include=must, size=2)

    assert [view.cards[view.tokens[i].card].index for i in chosen] == [5, 4]


def test_preference_skips_cards_held_in_another_mode(h200: list[devices.DeviceGroup]) -> None:
    book = Ledger()
    shared = _view(h200, "shared")
    _grant(shared, _ids(shared, 0, 0), book)
    view = _view(h200, "exclusive", book)
    available = [i for c in range(8) for i in _ids(view, c, 0)]

    chosen = allocation.prefer(view, book, available=available, must_include=[], size=1)

    assert [view.cards[view.tokens[i].card].index for i in chosen] == [1]


def test_sliced_preference_packs_the_most_occupied_card_that_fits(
    h200: list[devices.DeviceGroup],
) -> None:
    book = Ledger()
    view = _view(h200, "sliced")
    _grant(view, _ids(view, 2, *range(100)), book)  # card 2: 28 slices left
    _grant(view, _ids(view, 6, *range(60)), book)  # card 6: 68 slices left
    held = {i for h in book.holdings() for i in h.device_ids}
    available = [i for i in view.tokens if i not in held]

    small = allocation.prefer(view, book, available=available, must_include=[], size=20)
    large = allocation.prefer(view, book, available=available, must_include=[], size=40)

    assert {view.cards[view.tokens[i].card].index for i in small} == {2}
    assert {view.cards[view.tokens[i].card].index for i in large} == {6}
    assert len(small) == 20 and len(large) == 40


def test_visibility_has_no_preference(h200: list[devices.DeviceGroup]) -> None:
    view = _view(h200, "visibility")

    assert (
        allocation.prefer(view, Ledger(), available=list(view.tokens)[:5], must_include=[], size=1)
        == []
    )


# ------------------------------------------------------------------ responders


def test_nvidia_exclusive_names_the_uuids(h200: list[devices.DeviceGroup]) -> None:
    view = _view(h200, "exclusive")
    grant = _grant(view, _ids(view, 1, 0) + _ids(view, 0, 0))
    uuids = [a.id for a in h200[0].accelerators[:2]]

    response = responders.respond(grant, host_lib_dir=LIB)

    assert response == dp.ContainerAllocateResponse(
        envs={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)}
    )


def test_nvidia_sliced_limits_and_preload_mounts(h200: list[devices.DeviceGroup]) -> None:
    view = _view(h200, "sliced")
    grant = _grant(view, _ids(view, 0, *range(32)))  # a quarter of a 143771 MiB card
    uuid = h200[0].accelerators[0].id

    response = responders.respond(grant, host_lib_dir=LIB)

    assert response.envs == {
        "NVIDIA_VISIBLE_DEVICES": uuid,
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{143771 * 32 // 128}m",
        "CUDA_DEVICE_SM_LIMIT": "25",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "LIBCUDA_LOG_LEVEL": "0",
    }
    assert response.mounts == [
        dp.Mount("/etc/ld.so.preload", f"{LIB}/nvidia/ld.so.preload", read_only=True),
        dp.Mount("/usr/local/vgpu/libvgpu.so", f"{LIB}/nvidia/cuda-12/libvgpu.so", read_only=True),
        dp.Mount("/tmp/vgpulock", "/tmp/vgpulock", read_only=False),
    ]
    assert response.devices == []


def test_nvidia_partitioned_names_mig_devices(h100_mig: list[devices.DeviceGroup]) -> None:
    view = _view(h100_mig, "partitioned")
    grant = _grant(view, _ids(view, 1, 2))

    response = responders.respond(grant, host_lib_dir=LIB)

    assert response == dp.ContainerAllocateResponse(envs={"NVIDIA_VISIBLE_DEVICES": "1:2"})


def test_amd_gets_device_nodes_and_rocr_visible_devices(
    rx7800: list[devices.DeviceGroup],
) -> None:
    view = _view(rx7800, "shared")
    grant = _grant(view, _ids(view, 0, 3) + _ids(view, 1, 0))
    (a, b) = rx7800[0].accelerators

    response = responders.respond(grant, host_lib_dir=LIB)

    assert response.envs == {
        "ROCR_VISIBLE_DEVICES": f"{a.id},{b.id}",
        "AMD_VISIBLE_DEVICES": "none",
    }
    assert [(d.container_path, d.host_path, d.permissions) for d in response.devices] == [
        ("/dev/kfd", "/dev/kfd", "rw"),
        (f"/dev/dri/card{a.physical_indexes[0]}",) * 2 + ("rw",),
        (f"/dev/dri/renderD{a.physical_indexes[1]}",) * 2 + ("rw",),
        (f"/dev/dri/card{b.physical_indexes[0]}",) * 2 + ("rw",),
        (f"/dev/dri/renderD{b.physical_indexes[1]}",) * 2 + ("rw",),
    ]
