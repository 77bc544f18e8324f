"""What the hot path caches (held modes, per-card tokens, id indexes, encoded lists) never hides a
change: every list that changed is re-sent in full, every list that did not keeps its bytes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.to_thread
import msgspec
import pytest
from deviceplugin_harness import with_health
from hypothesis import given
from hypothesis import strategies as st

from agent.deviceplugin import encoding, errors, resources
from agent.deviceplugin import holdings as ledger
from agent.deviceplugin.node import Node
from agent.deviceplugin.resources import HEALTHY, UNHEALTHY, UNITS_PER_CARD, Mode
from agent.deviceplugin.running import device_plugins
from agent.deviceplugin.settings import DevicePluginSettings
from agent.testing import FakeKubelet, Watch, unary
from bus import devices, events
from bus.testing import eventually
from proto.deviceplugin import v1beta1 as dp

MODES: tuple[Mode, ...] = ("exclusive", "shared", "sliced", "partitioned", "visibility")


def _node(tmp_path: Path) -> tuple[Node, list[events.Event]]:
    published: list[events.Event] = []
    settings = DevicePluginSettings.for_tests(str(tmp_path), release_grace_s=0.0)
    return Node(settings, publish=published.append), published


def _health(node: Node, mode: Mode, card: str) -> set[str]:
    """The health of ``card``'s tokens in the list ``mode`` sends now (never a stale list)."""
    servicer = node.offers.servicers[("nvidia", mode)]
    assert servicer.listing().wire == encoding.listing(servicer.spec.tokens)
    return {HEALTHY if t.healthy else UNHEALTHY for t in servicer.spec.tokens if t.card == card}


def _token(groups: Sequence[devices.DeviceGroup], card: int, index: int = 0) -> str:
    return f"nvidia-h200:{groups[0].accelerators[card].id}:{index:04d}"


# ------------------------------------------------------------------ the node, no sockets


@pytest.mark.anyio
async def test_a_first_holding_blocks_the_card_in_the_other_modes_and_only_those_lists_change(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    node, _ = _node(tmp_path)
    node.update(h200)
    card = h200[0].accelerators[2].id
    before = {key: (s.spec, s.listing()) for key, s in node.offers.servicers.items()}

    node.allocate(("nvidia", "sliced"), [_token(h200, 2)])
    node.allocate(("nvidia", "sliced"), [_token(h200, 2, 1)])  # same card, same mode

    changed = {k for k, s in node.offers.servicers.items() if s.listing() is not before[k][1]}
    assert changed == {("nvidia", "exclusive"), ("nvidia", "shared")}
    assert all(node.offers.servicers[k].spec is before[k][0] for k in before if k not in changed)
    assert _health(node, "exclusive", card) == {"Unhealthy"}
    assert _health(node, "shared", card) == {"Unhealthy"}
    assert _health(node, "sliced", card) == {"Healthy"}
    assert _health(node, "visibility", card) == {"Healthy"}
    other = h200[0].accelerators[3].id
    assert _health(node, "exclusive", other) == _health(node, "shared", other) == {"Healthy"}

    node.reconcile([])  # kubelet lists no container: both holdings are released
    assert {k: s.listing().wire for k, s in node.offers.servicers.items()} == {
        k: listing.wire for k, (_, listing) in before.items()
    }

    node.allocate(("nvidia", "exclusive"), [_token(h200, 2)])  # now the other way round
    assert _health(node, "sliced", card) == _health(node, "shared", card) == {"Unhealthy"}
    assert _health(node, "exclusive", card) == _health(node, "visibility", card) == {"Healthy"}


@pytest.mark.anyio
async def test_health_changes_after_caching_reach_every_list(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    node, _ = _node(tmp_path)
    node.update(h200)
    node.allocate(("nvidia", "sliced"), [_token(h200, 4)])
    card = h200[0].accelerators[4].id
    cached = {k: s.listing() for k, s in node.offers.servicers.items()}

    node.update(with_health(h200, 4, unhealthy=True))
    assert all(_health(node, m, card) == {"Unhealthy"} for m in MODES if m != "partitioned")
    assert (
        node.offers.servicers[("nvidia", "partitioned")].listing()
        is cached[("nvidia", "partitioned")]
    )

    node.update(h200)  # back to a state seen before: cached tokens and bytes come back
    assert {k: s.listing().wire for k, s in node.offers.servicers.items()} == {
        k: c.wire for k, c in cached.items()
    }
    assert _health(node, "exclusive", card) == {"Unhealthy"}  # still held in sliced mode
    assert _health(node, "sliced", card) == _health(node, "visibility", card) == {"Healthy"}


@pytest.mark.anyio
async def test_allocate_sees_tokens_that_came_and_went(
    tmp_path: Path, h200: list[devices.DeviceGroup]
) -> None:
    node, _ = _node(tmp_path)
    node.update(h200)
    with pytest.raises(errors.Conflict, match="only mirrors"):  # known id; no Pod to mirror
        node.allocate(("nvidia", "visibility"), [_token(h200, 6)])
    fewer = [msgspec.structs.replace(h200[0], accelerators=h200[0].accelerators[:6])]

    node.update(fewer)
    with pytest.raises(errors.BadRequest, match="unknown device id"):
        node.allocate(("nvidia", "sliced"), [_token(h200, 6)])
    node.update(h200)
    node.allocate(("nvidia", "sliced"), [_token(h200, 6)])

    assert node.ledger.mode_of(h200[0].accelerators[6].id) == "sliced"


@pytest.mark.anyio
async def test_allocate_follows_a_card_leaving_and_entering_partition_mode(
    tmp_path: Path, h100_mig: list[devices.DeviceGroup]
) -> None:
    """The card stays, only its tokens change: an id index kept too long would still know them."""
    node, _ = _node(tmp_path)
    card = h100_mig[0].accelerators[0]
    whole = msgspec.structs.replace(card.status, physical_sliced=None)
    unpartitioned = [
        msgspec.structs.replace(
            h100_mig[0],
            accelerators=(
                msgspec.structs.replace(card, status=whole),
                *h100_mig[0].accelerators[1:],
            ),
        )
    ]
    exclusive = resources.device_id(h100_mig[0].id, card.id, 0)

    node.update(h100_mig)
    with pytest.raises(errors.BadRequest, match="unknown device id"):
        node.allocate(("nvidia", "exclusive"), [exclusive])
    node.update(unpartitioned)
    node.update(h100_mig)
    with pytest.raises(errors.BadRequest, match="unknown device id"):
        node.allocate(("nvidia", "exclusive"), [exclusive])
    node.update(unpartitioned)
    node.allocate(("nvidia", "exclusive"), [exclusive])

    assert node.ledger.mode_of(card.id) == "exclusive"


# ------------------------------------------------------------------ held modes, per card


_Op = tuple[str, int, int, Mode]


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["charge", "release"]),
            st.integers(0, 5),  # first device
            st.integers(0, 2),  # card
            st.sampled_from(["exclusive", "shared", "sliced"]),
        ),
        max_size=30,
    )
)
def test_held_modes_agree_with_every_holding_in_recording_order(ops: list[_Op]) -> None:
    """Walking cards gives what walking all holdings gave, conflicting restores included."""
    book = ledger.Ledger()
    shadow: dict[str, ledger.Holding] = {}
    for action, first, card, mode in ops:
        ids = (f"g:d:{first:04d}", f"g:d:{first + 1:04d}")
        if action == "release":
            book.release(ledger.allocation_id("r", ids))
            shadow.pop(ledger.allocation_id("r", ids), None)
            continue
        holding = ledger.Holding(
            allocation_id=ledger.allocation_id("r", ids),
            resource="r",
            mode=mode,
            device_ids=ids,
            charges=((f"c{card}", UNITS_PER_CARD // 4), (f"c{card + 1}", 0)),
            since=0.0,
        )
        book.charge(holding)  # unchecked, as restore does: modes may clash on a card
        for key in [k for k, h in shadow.items() if set(h.device_ids) & set(ids)]:
            del shadow[key]
        shadow[holding.allocation_id] = holding

    expected = {c: h.mode for h in shadow.values() for c, u in h.charges if u > 0}
    assert book.held_modes() == expected


# ------------------------------------------------------------------ over the sockets

AMD: dict[Mode, str] = {
    "exclusive": "amd.com/gpu",
    "shared": "amd.com/gpu.shared",
    "sliced": "amd.com/gpu.sliced",
    "visibility": "device.gpustack.ai/amd.visibility",
}


async def _async(value: bool) -> bool:
    return value


@pytest.mark.anyio
async def test_every_stream_gets_each_changed_list_in_full(
    tmp_path: Path, kubelet: FakeKubelet, rx7800: list[devices.DeviceGroup]
) -> None:
    """Two kubelet streams on one server share its encoded list; a holding and health flips
    reach every stream whose list they change, and only those."""
    card = rx7800[0].accelerators[1].id
    # three of 128 slices: the least share of a 60-CU card that covers one compute unit
    sliced = [f"radeon-rx-7800-xt:{card}:{i:04d}" for i in range(3)]
    settings = DevicePluginSettings.for_tests(str(tmp_path))
    async with device_plugins(settings, publish=lambda e: None) as plugins:
        plugins.update(rx7800)
        await eventually(lambda: _async(sorted(kubelet.registered()) == sorted(AMD.values())))
        watches = {
            "exclusive": Watch(tmp_path / "amd.exclusive.sock"),
            "exclusive again": Watch(tmp_path / "amd.exclusive.sock"),
            "shared": Watch(tmp_path / "amd.shared.sock"),
            "sliced": Watch(tmp_path / "amd.sliced.sock"),
            "visibility": Watch(tmp_path / "amd.visibility.sock"),
        }
        try:
            expected = dict.fromkeys(watches, 1)
            await _arrived(watches, expected)
            request = dp.AllocateRequest(
                container_requests=[dp.ContainerAllocateRequest(devices_ids=sliced)]
            )
            await anyio.to_thread.run_sync(
                unary,
                tmp_path / "amd.sliced.sock",
                "/v1beta1.DevicePlugin/Allocate",
                request,
                dp.AllocateResponse.FromString,
            )
            expected.update({"exclusive": 2, "exclusive again": 2, "shared": 2})
            await _arrived(watches, expected)
            servicers = plugins.servicers()
            assert [servicers[("amd", m)].updates_sent for m in AMD] == [4, 2, 1, 1]

            # card 1 is held in sliced mode, so already Unhealthy in the exclusive and shared
            # lists: its own health changes only the sliced and visibility lists
            plugins.update(with_health(rx7800, 1, unhealthy=True))
            expected.update({"sliced": 2, "visibility": 2})
            await _arrived(watches, expected)
            plugins.update(rx7800)
            expected.update({"sliced": 3, "visibility": 3})
            await _arrived(watches, expected)
            plugins.update(with_health(rx7800, 0, unhealthy=True))  # card 0: every list
            await _arrived(watches, {name: n + 1 for name, n in expected.items()})
        finally:
            for watch in watches.values():
                watch.close()

    def states(name: str) -> list[str]:
        return [
            "".join(sorted({h for i, h in u.items() if card in i})) for u in _seen(watches[name])
        ]

    assert states("exclusive") == states("exclusive again")
    assert states("exclusive") == ["Healthy", "Unhealthy", "Unhealthy"]
    assert states("shared") == ["Healthy", "Unhealthy", "Unhealthy"]
    assert states("sliced") == ["Healthy", "Unhealthy", "Healthy", "Healthy"]
    assert states("visibility") == ["Healthy", "Unhealthy", "Healthy", "Healthy"]
    zero = rx7800[0].accelerators[0].id
    assert all(
        next(h for i, h in _seen(w)[-1].items() if zero in i) == "Unhealthy"
        for w in watches.values()
    )
    sizes = {name: {len(h) for h in _seen(w)} for name, w in watches.items()}
    assert sizes == {
        "exclusive": {2},
        "exclusive again": {2},
        "shared": {20},
        "sliced": {256},
        "visibility": {1024},
    }


def _seen(watch: Watch) -> list[dict[str, str]]:
    return watch.health()


async def _arrived(watches: dict[str, Watch], counts: dict[str, int]) -> None:
    async def check() -> bool:
        return all(len(watches[name].updates) >= n for name, n in counts.items())

    await eventually(check)
    assert {name: len(watches[name].updates) for name in counts} == counts
