"""Allocate and GetPreferredAllocation decisions, and each vendor's injection: no event loop."""

from __future__ import annotations

import os

import msgspec
import pytest

from agent.deviceplugin import allocation, errors, resources, responders
from agent.deviceplugin.holdings import Ledger
from agent.deviceplugin.injection import DeviceNode, Injection, Mount
from bus import devices

LIB = "/var/lib/gpustack/operator/lib"
WORK = "/var/lib/gpustack/operator/pods"


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


def _respond(grant: allocation.Grant) -> Injection:
    return responders.respond(grant, host_lib_dir=LIB, host_work_dir=WORK)


def test_nvidia_exclusive_names_the_uuids(h200: list[devices.DeviceGroup]) -> None:
    view = _view(h200, "exclusive")
    grant = _grant(view, _ids(view, 1, 0) + _ids(view, 0, 0))
    uuids = [a.id for a in h200[0].accelerators[:2]]

    assert _respond(grant) == Injection(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)})


@pytest.mark.parametrize("mode", ["shared", "visibility"])
def test_nvidia_shared_and_visibility_name_the_uuids_only(
    h200: list[devices.DeviceGroup], mode: resources.Mode
) -> None:
    view = _view(h200, mode)
    grant = _grant(view, _ids(view, 3, 0) + _ids(view, 1, 2))
    uuids = [h200[0].accelerators[i].id for i in (1, 3)]

    assert _respond(grant) == Injection(envs={"NVIDIA_VISIBLE_DEVICES": ",".join(uuids)})


def test_nvidia_sliced_limits_preload_and_work_directory(
    h200: list[devices.DeviceGroup],
) -> None:
    view = _view(h200, "sliced")
    ids = _ids(view, 0, *range(32))  # a quarter of a 143771 MiB card
    grant = _grant(view, ids)
    uuid = h200[0].accelerators[0].id
    work = responders.work_dir(WORK, f"nvidia.com/gpu.sliced/{min(ids)}")

    injection = _respond(grant)

    assert injection.envs == {
        "NVIDIA_VISIBLE_DEVICES": uuid,
        "CUDA_DEVICE_MEMORY_LIMIT_0": f"{143771 * 32 // 128}m",
        "CUDA_DEVICE_SM_LIMIT": "25",
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": "/tmp/vgpu/cudevshr.cache",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "LIBCUDA_LOG_LEVEL": "0",
    }
    assert injection.mounts == (
        Mount("/etc/ld.so.preload", f"{LIB}/nvidia/ld.so.preload", read_only=True),
        Mount("/usr/local/vgpu/libvgpu.so", f"{LIB}/nvidia/cuda-12/libvgpu.so", read_only=True),
        Mount("/tmp/vgpulock", "/tmp/vgpulock", read_only=False),
        Mount("/tmp/vgpu", f"{work}/tmp/vgpu", read_only=False),
        Mount("/dev/shm", "/dev/shm", read_only=False),
    )
    assert injection.devices == ()
    assert injection.host_dirs == (f"{work}/tmp/vgpu",)
    assert work.startswith(f"{WORK}/nvidia.com_gpu.sliced_nvidia-h200_GPU-")


def test_nvidia_sliced_keys_follow_ascending_index_and_the_smallest_share_caps_sms(
    h200: list[devices.DeviceGroup],
) -> None:
    view = _view(h200, "sliced")
    grant = _grant(view, _ids(view, 5, *range(64)) + _ids(view, 2, *range(16)))
    (two, five) = (h200[0].accelerators[2].id, h200[0].accelerators[5].id)

    envs = _respond(grant).envs

    assert envs["NVIDIA_VISIBLE_DEVICES"] == f"{two},{five}"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{143771 * 16 // 128}m"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_1"] == f"{143771 * 64 // 128}m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "12"


def test_each_sliced_allocation_gets_its_own_work_directory(
    h200: list[devices.DeviceGroup],
) -> None:
    view = _view(h200, "sliced")
    book = Ledger()
    first = _respond(_grant(view, _ids(view, 0, 0, 1), book))
    second = _respond(_grant(view, _ids(view, 0, 2, 3), book))
    again = _respond(_grant(view, _ids(view, 0, 1, 0), book))  # kubelet retrying the first

    assert first.host_dirs != second.host_dirs
    assert again.host_dirs == first.host_dirs


def test_work_directories_are_safe_names_that_keep_lookalike_ids_apart() -> None:
    a = responders.work_dir("/w", "nvidia.com/gpu.sliced/g:GPU-1:0000")
    b = responders.work_dir("/w", "nvidia.com_gpu.sliced_g_GPU-1_0000")

    assert a != b
    assert os.path.dirname(a) == "/w" and os.path.dirname(b) == "/w"
    assert os.path.basename(a).startswith("nvidia.com_gpu.sliced_g_GPU-1_0000-")
    assert responders.work_dir("/w", "../../etc").startswith("/w/etc-")


def test_nvidia_partitioned_names_mig_devices(h100_mig: list[devices.DeviceGroup]) -> None:
    view = _view(h100_mig, "partitioned")
    grant = _grant(view, _ids(view, 1, 2))

    assert _respond(grant) == Injection(envs={"NVIDIA_VISIBLE_DEVICES": "1:2"})


def _amd_devices(*cards: devices.Accelerator) -> tuple[DeviceNode, ...]:
    nodes = [DeviceNode("/dev/kfd", "/dev/kfd", "rw")]
    for card in cards:
        card_node, render_node = (card.physical_indexes or ())[:2]
        for node in (f"/dev/dri/card{card_node}", f"/dev/dri/renderD{render_node}"):
            nodes.extend([DeviceNode(node, node, "rw")])
    return tuple(nodes)


@pytest.mark.parametrize("mode", ["exclusive", "shared", "visibility"])
def test_amd_gets_device_nodes_and_rocr_visible_devices(
    rx7800: list[devices.DeviceGroup], mode: resources.Mode
) -> None:
    view = _view(rx7800, mode)
    grant = _grant(view, _ids(view, 0, 0) + _ids(view, 1, 0))
    (a, b) = rx7800[0].accelerators

    assert _respond(grant) == Injection(
        envs={"ROCR_VISIBLE_DEVICES": f"{a.id},{b.id}", "AMD_VISIBLE_DEVICES": "none"},
        devices=_amd_devices(a, b),
    )


def test_amd_sliced_adds_the_vrocm_preload_memory_caps_and_cu_masks(
    rx7800: list[devices.DeviceGroup],
) -> None:
    view = _view(rx7800, "sliced")
    # card 1 holds slices 64..95 (a quarter), card 0 slices 0..63 (half): 60 CUs, 16368 MiB each
    grant = _grant(view, _ids(view, 1, *range(64, 96)) + _ids(view, 0, *range(64)))
    (a, b) = rx7800[0].accelerators
    assert rx7800[0].cores == 60 and rx7800[0].memory == 16368

    injection = _respond(grant)

    assert injection == Injection(
        envs={
            "ROCR_VISIBLE_DEVICES": f"{a.id},{b.id}",
            "AMD_VISIBLE_DEVICES": "none",
            "VROCM_DEVICE_MEMORY_LIMIT_0": str(16368 // 2),
            "VROCM_DEVICE_MEMORY_LIMIT_1": str(16368 // 4),
            "HSA_CU_MASK": "0:0-29;1:30-44",
            "LIBVROCM_LOG_LEVEL": "1",
        },
        mounts=(
            Mount("/etc/ld.so.preload", f"{LIB}/amd/ld.so.preload", read_only=True),
            Mount("/usr/local/vrocm/libvrocm.so", f"{LIB}/amd/libvrocm.so", read_only=True),
        ),
        devices=_amd_devices(a, b),
    )


@pytest.mark.parametrize(
    ("slices", "mask"),
    [
        ((0, 1, 2), "0"),  # 3 of 128 slices of 60 CUs: 1.4 CUs, rounded down to one
        ((5, 6, 7, 8, 9), "2-3"),  # 2.34 CUs from CU 2.34: two CUs from CU 2
        ((5, 9, 40, 41, 42), "2-3"),  # the count and the lowest slice decide, not contiguity
        (tuple(range(128)), "0-59"),
        ((125, 126, 127), "58"),  # 1.4 CUs from CU 58.6: rounding down never passes CU 59
    ],
)
def test_cu_masks_round_down_and_start_at_the_first_slice(
    rx7800: list[devices.DeviceGroup], slices: tuple[int, ...], mask: str
) -> None:
    card = resources.cards_of(rx7800)[rx7800[0].accelerators[0].id]

    assert responders.cu_mask(card, tuple(sorted(slices))) == mask


def test_an_amd_share_below_one_compute_unit_is_refused(
    rx7800: list[devices.DeviceGroup],
) -> None:
    view = _view(rx7800, "sliced")
    grant = _grant(view, _ids(view, 0, 0, 1))  # 2 of 128 slices of 60 CUs: 0.94 CU

    with pytest.raises(errors.CannotInject, match="below one of its 60 compute units.*at least 3"):
        _respond(grant)


def test_an_amd_card_without_a_cu_count_cannot_be_sliced(
    rx7800: list[devices.DeviceGroup],
) -> None:
    groups = [msgspec.structs.replace(rx7800[0], cores=None)]
    view = _view(groups, "sliced")

    with pytest.raises(errors.CannotInject, match="reports no compute units"):
        _respond(_grant(view, _ids(view, 0, *range(64))))


@pytest.mark.parametrize(
    ("slices", "percent", "mask"),
    [
        ((0,), 50, "0-29"),  # a pending container's own 50 % of 60 CUs, from its slice's CU
        ((64,), 50, "30-59"),
        ((127,), 25, "45-59"),  # moved down so the run ends on the last CU
        ((10,), 2, "4"),  # 1.2 CUs: one
    ],
)
def test_a_pending_containers_cores_percentage_sizes_its_cu_mask(
    rx7800: list[devices.DeviceGroup], slices: tuple[int, ...], percent: int, mask: str
) -> None:
    card = resources.cards_of(rx7800)[rx7800[0].accelerators[0].id]
    assert responders.cu_mask(card, slices, percent=percent) == mask
    with pytest.raises(errors.CannotInject, match="ask for at least 2% cores"):
        responders.cu_mask(card, slices, percent=1)
