"""Which servers and tokens a node advertises: pure functions of groups, switches and modes."""

from __future__ import annotations

import msgspec

from agent.deviceplugin import resources
from bus import devices


def _unhealthy(groups: list[devices.DeviceGroup], index: int) -> list[devices.DeviceGroup]:
    group = groups[0]
    accs = list(group.accelerators)
    acc = accs[index]
    accs[index] = msgspec.structs.replace(
        acc, status=msgspec.structs.replace(acc.status, unhealthy=True)
    )
    return [msgspec.structs.replace(group, accelerators=tuple(accs))]


def test_h200_and_rx7800_call_for_every_server_with_the_reference_names(
    h200: list[devices.DeviceGroup], rx7800: list[devices.DeviceGroup]
) -> None:
    specs = resources.plan_servers(resources.cards_of(h200 + rx7800), held_modes={})

    assert {s.resource: len(s.tokens) for s in specs.values()} == {
        "nvidia.com/gpu": 8,
        "nvidia.com/gpu.shared": 80,
        "nvidia.com/gpu.sliced": 8 * 128,
        "nvidia.com/gpu.partitioned": 0,
        "device.gpustack.ai/nvidia.visibility": 8 * 512,
        "amd.com/gpu": 2,
        "amd.com/gpu.shared": 20,
        "amd.com/gpu.sliced": 2 * 128,
        "device.gpustack.ai/amd.visibility": 2 * 512,
    }
    assert specs[("nvidia", "sliced")].socket_name == "nvidia.sliced.sock"


def test_token_ids_name_group_card_and_a_four_digit_index(
    h200: list[devices.DeviceGroup],
) -> None:
    spec = resources.plan_servers(resources.cards_of(h200), held_modes={})[("nvidia", "shared")]
    first = h200[0].accelerators[0]

    assert [t.id for t in spec.tokens[:2]] == [
        f"nvidia-h200:{first.id}:0000",
        f"nvidia-h200:{first.id}:0001",
    ]
    assert all(resources.is_well_formed(t.id) for t in spec.tokens)


def test_long_ids_are_shortened_deterministically_to_63_characters(
    h100_mig: list[devices.DeviceGroup],
) -> None:
    cards = resources.cards_of(h100_mig)
    first = resources.plan_servers(cards, held_modes={})
    again = resources.plan_servers(cards, held_modes={})
    ids = [t.id for s in first.values() for t in s.tokens]

    assert ids == [t.id for s in again.values() for t in s.tokens]
    assert max(len(i) for i in ids) == 63
    # ids are unique within a server (resource); servers reuse them, as kubelet keys by resource
    assert all(len({t.id for t in s.tokens}) == len(s.tokens) for s in first.values())
    assert all(resources.is_well_formed(i) for i in ids)


def test_partitioned_cards_advertise_partition_tokens_only(
    h100_mig: list[devices.DeviceGroup],
) -> None:
    specs = resources.plan_servers(resources.cards_of(h100_mig), held_modes={})

    # cards 0-3 are in MIG mode (7 instances of the smallest profile each), 4-7 are whole
    assert len(specs[("nvidia", "partitioned")].tokens) == 4 * 7
    assert len(specs[("nvidia", "exclusive")].tokens) == 4
    assert all(not t.numa_nodes for t in specs[("nvidia", "partitioned")].tokens)


def test_no_switches_remove_their_servers(h200: list[devices.DeviceGroup]) -> None:
    specs = resources.plan_servers(
        resources.cards_of(h200),
        held_modes={},
        no_shared=True,
        no_sliced=True,
        no_partitioned=True,
    )

    assert sorted(s.resource for s in specs.values()) == [
        "device.gpustack.ai/nvidia.visibility",
        "nvidia.com/gpu",
    ]


def test_topology_comes_from_the_numa_affinity(h200: list[devices.DeviceGroup]) -> None:
    spec = resources.plan_servers(resources.cards_of(h200), held_modes={})[("nvidia", "exclusive")]

    assert [t.numa_nodes for t in spec.tokens] == [(0,)] * 4 + [(1,)] * 4


def test_a_card_held_in_one_mode_is_unhealthy_in_the_others_but_visible(
    h200: list[devices.DeviceGroup],
) -> None:
    cards = resources.cards_of(h200)
    held = h200[0].accelerators[0].id
    specs = resources.plan_servers(cards, held_modes={held: "exclusive"})

    def health(mode: resources.Mode) -> set[bool]:
        return {t.healthy for t in specs[("nvidia", mode)].tokens if t.card == held}

    assert health("exclusive") == {True}
    assert health("shared") == {False}
    assert health("sliced") == {False}
    assert health("visibility") == {True}


def test_an_unhealthy_card_keeps_its_tokens_marked_unhealthy(
    h200: list[devices.DeviceGroup],
) -> None:
    specs = resources.plan_servers(resources.cards_of(_unhealthy(h200, 2)), held_modes={})

    exclusive = specs[("nvidia", "exclusive")].tokens
    assert [t.healthy for t in exclusive] == [True, True, False, True, True, True, True, True]


def test_held_cards_stay_when_detection_loses_them(h200: list[devices.DeviceGroup]) -> None:
    old = resources.cards_of(h200)
    gone = h200[0].accelerators[0].id
    fewer = [msgspec.structs.replace(h200[0], accelerators=h200[0].accelerators[1:])]

    cards = resources.keep_held(resources.cards_of(fewer), old, [gone])
    dropped = resources.keep_held(resources.cards_of(fewer), old, [])

    assert cards[gone].unhealthy
    assert len(cards) == 8
    assert gone not in dropped


def test_units_per_token_follow_the_mode(h200: list[devices.DeviceGroup]) -> None:
    card = next(iter(resources.cards_of(h200).values()))

    assert resources.units_per_token(card, "exclusive") == 1_600_000
    assert resources.units_per_token(card, "shared") == 160_000
    assert resources.units_per_token(card, "sliced") == 12_500
    assert resources.units_per_token(card, "visibility") == 0


def test_numa_lists_parse_and_garbage_yields_none() -> None:
    assert resources.numa_nodes("0-1,3") == (0, 1, 3)
    assert resources.numa_nodes(None) == ()
    assert resources.numa_nodes("x") == ()
