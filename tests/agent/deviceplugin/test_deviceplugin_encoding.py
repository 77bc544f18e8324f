"""The hand-written wire forms of ListAndWatch and Allocate replies, held to betterproto's bytes."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import pytest

from agent.deviceplugin import allocation, encoding, resources, responders
from agent.deviceplugin.holdings import Ledger
from agent.deviceplugin.injection import DeviceNode, Injection, Mount
from agent.deviceplugin.resources import HEALTHY, UNHEALTHY, Token
from bus import devices
from proto.deviceplugin import v1beta1 as dp

LIB = "/var/lib/gpustack/operator/lib"
WORK = "/var/lib/gpustack/operator/pods"


def _reference(tokens: tuple[Token, ...]) -> bytes:
    """The list as betterproto writes it: what the servers sent before :mod:`encoding`."""
    listed = []
    for token in tokens:
        device = dp.Device(id=token.id, health=HEALTHY if token.healthy else UNHEALTHY)
        if token.numa_nodes:
            device.topology = dp.TopologyInfo(nodes=[dp.NumaNode(id=n) for n in token.numa_nodes])
        listed.append(device)
    return bytes(dp.ListAndWatchResponse(devices=listed))


def _unhealthy(groups: list[devices.DeviceGroup], index: int) -> list[devices.DeviceGroup]:
    group = groups[0]
    accs = list(group.accelerators)
    status = msgspec.structs.replace(accs[index].status, unhealthy=True)
    accs[index] = msgspec.structs.replace(accs[index], status=status)
    return [msgspec.structs.replace(group, accelerators=tuple(accs)), *groups[1:]]


@pytest.mark.parametrize("profile", ["h200", "h100_mig", "rx7800"])
def test_every_list_is_byte_for_byte_betterprotos(
    profile: str, request: pytest.FixtureRequest
) -> None:
    groups: list[devices.DeviceGroup] = _unhealthy(request.getfixturevalue(profile), 1)
    cards = resources.cards_of(groups)
    held = {next(iter(cards)): "sliced"}  # blocked tokens in the other modes
    specs = resources.plan_servers(cards, held_modes=held)  # type: ignore[arg-type]

    for spec in specs.values():
        assert encoding.listing(spec.tokens) == _reference(spec.tokens), spec.resource
    tokens = [t for s in specs.values() for t in s.tokens]
    assert {t.healthy for t in tokens} == {True, False}


def test_topology_edge_cases_match_too() -> None:
    tokens = (
        Token(id="g:a:0000", card="a", index=0, numa_nodes=(), healthy=True),
        Token(id="g:a:0001", card="a", index=1, numa_nodes=(0,), healthy=False),
        Token(id="g:a:0002", card="a", index=2, numa_nodes=(0, 1, 300), healthy=True),
        Token(id="g:" + "x" * 58 + ":0003", card="a", index=3, numa_nodes=(2,), healthy=True),
    )

    assert encoding.listing(tokens) == _reference(tokens)
    assert encoding.listing(()) == b""
    parsed = dp.ListAndWatchResponse.FromString(encoding.listing(tokens))
    assert [[n.id for n in d.topology.nodes] for d in parsed.devices] == [[], [0], [0, 1, 300], [2]]


def _grant(groups: list[devices.DeviceGroup], mode: resources.Mode, cards: int) -> allocation.Grant:
    """A grant over the first ``cards`` cards that have tokens: one token each, three sliced."""
    known = resources.cards_of(groups)
    spec = resources.plan_servers(known, held_modes={})[(groups[0].manufacturer, mode)]
    per_card: dict[str, list[str]] = {}
    for token in spec.tokens:
        per_card.setdefault(token.card, []).append(token.id)
    take = 3 if mode == "sliced" else 1
    ids = [i for card in list(per_card)[:cards] for i in per_card[card][:take]]
    view = allocation.View(mode, spec.resource, {t.id: t for t in spec.tokens}, known)
    return allocation.decide(view, ids, Ledger(), now=0.0)


@pytest.mark.parametrize(
    ("profile", "mode"),
    [
        ("h200", "exclusive"),
        ("h200", "shared"),
        ("h200", "sliced"),
        ("h100_mig", "partitioned"),
        ("rx7800", "exclusive"),
        ("rx7800", "sliced"),
    ],
)
def test_allocate_replies_are_byte_for_byte_betterprotos(
    profile: str, mode: resources.Mode, request: pytest.FixtureRequest
) -> None:
    groups: list[devices.DeviceGroup] = request.getfixturevalue(profile)
    injections = [
        responders.respond(_grant(groups, mode, n), host_lib_dir=LIB, host_work_dir=WORK)
        for n in (1, 2)
    ]
    reply = dp.AllocateResponse(
        container_responses=[encoding.container_response(i) for i in injections]
    )

    assert encoding.allocate_response(reply) == bytes(reply)
    assert dp.AllocateResponse.FromString(encoding.allocate_response(reply)) == reply


def test_an_injection_becomes_the_same_message_in_the_same_order() -> None:
    injection = Injection(
        envs={"B": "2", "A": "1"},
        mounts=(Mount("/z", "/hz", read_only=False), Mount("/a", "/ha", read_only=True)),
        devices=(DeviceNode("/dev/b", "/dev/b", "rw"), DeviceNode("/dev/a", "/dev/c", "r")),
        annotations={"k": "v"},
        host_dirs=("/not/sent",),
    )

    assert encoding.container_response(injection) == dp.ContainerAllocateResponse(
        envs={"B": "2", "A": "1"},
        mounts=[dp.Mount("/z", "/hz", read_only=False), dp.Mount("/a", "/ha", read_only=True)],
        devices=[dp.DeviceSpec("/dev/b", "/dev/b", "rw"), dp.DeviceSpec("/dev/a", "/dev/c", "r")],
        annotations={"k": "v"},
    )
    assert list(encoding.container_response(injection).envs) == ["B", "A"]


def test_every_allocate_field_is_written() -> None:
    reply = dp.AllocateResponse(
        container_responses=[
            dp.ContainerAllocateResponse(),
            dp.ContainerAllocateResponse(
                envs={"A": "1", "EMPTY": "", "ü": "ß"},
                mounts=[dp.Mount("/c", "/h", read_only=True), dp.Mount("/c2", "", False)],
                devices=[dp.DeviceSpec("/dev/x", "/dev/y", "rw"), dp.DeviceSpec()],
                annotations={"k8s.io/x": "y" * 300},
                cdi_devices=[dp.CdiDevice("vendor.com/gpu=0"), dp.CdiDevice()],
            ),
        ]
    )

    assert encoding.allocate_response(reply) == bytes(reply)
    assert encoding.allocate_response(dp.AllocateResponse()) == b""


def test_a_regenerated_message_with_a_new_field_fails_here() -> None:
    """The encoder writes these fields; a field added to the stubs must be added to it."""
    written: dict[Any, set[str]] = {
        dp.ListAndWatchResponse: {"devices"},
        dp.Device: {"id", "health", "topology"},
        dp.TopologyInfo: {"nodes"},
        dp.NumaNode: {"id"},
        dp.AllocateResponse: {"container_responses"},
        dp.ContainerAllocateResponse: {"envs", "mounts", "devices", "annotations", "cdi_devices"},
        dp.Mount: {"container_path", "host_path", "read_only"},
        dp.DeviceSpec: {"container_path", "host_path", "permissions"},
        dp.CdiDevice: {"name"},
    }

    for message, fields in written.items():
        assert {f.name for f in dataclasses.fields(message)} == fields, message.__name__


def test_one_token_is_encoded_once() -> None:
    token = Token(id="g:b:0000", card="b", index=0, numa_nodes=(1,), healthy=True)
    same = Token(id="g:b:0000", card="b", index=0, numa_nodes=(1,), healthy=True)

    assert encoding.device(token) is encoding.device(same)
    assert encoding.device(token) != encoding.device(dataclasses.replace(token, healthy=False))
