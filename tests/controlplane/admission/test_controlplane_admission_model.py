"""The request model's pure parts: the folds, quantities, key families, groups, the catalog."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import msgspec
import pytest
from admission_helpers import GROUP, H100_MIB, H100_MIG, H200, H200_MIB, Catalog, container, pod

from bus import events
from bus.devices import Accelerator, DeviceGroup
from controlplane.admission.cards import LedgerCatalog, cards_of
from controlplane.admission.mutating import mutate
from controlplane.admission.pods import Pod, parse_quantity, pointer
from controlplane.admission.requests import (
    UNITS,
    Family,
    family_of,
    mib_units,
    named_groups,
    percent_units,
)
from controlplane.admission.validating import validate
from controlplane.reconciling.nodestates import Ledger


def test_units_basis() -> None:
    assert UNITS == 1_600_000
    assert percent_units(25) == 400_000
    assert percent_units(1) == 16_000
    assert percent_units(100) == UNITS


def test_mib_fold_on_an_h200() -> None:
    assert H200[0].memory == H200_MIB == 143_771  # the simulated profile's NVML total
    assert mib_units(H200_MIB, H200_MIB) == UNITS
    assert mib_units(20_000, H200_MIB) == 222_576  # 20000 x 1.6e6 / 143771 = 222576.3
    assert mib_units(71_885, H200_MIB) == 799_994  # just under half: floor, never rounded up
    assert mib_units(1, H200_MIB) == 11


def test_partition_profile_folds_like_its_memory() -> None:
    card = cards_of({"h100": H100_MIG})["nvidia-h100-80gb-hbm3"]
    assert card.memory_mib == H100_MIB and card.profiles["3g.40gb"] == 40_448
    assert mib_units(card.profiles["3g.40gb"], H100_MIB) == 793_496
    assert (
        mib_units(card.profiles["7g.80gb"], H100_MIB) == 1_592_015
    )  # 81152 x 1.6e6 / 81559 = 1592015.6


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1), ("400k", 400_000), ("1600k", 1_600_000), ("1.6M", 1_600_000), ("16e4", 160_000),
        ("2Ki", 2048), ("1000m", 1), ("500m", Fraction(1, 2)), (3, 3), ("1E", 10**18),
    ],
)  # fmt: skip
def test_quantities_in_canonical_and_written_forms(text: str | int, value: Fraction) -> None:
    assert parse_quantity(text) == value


# No space (resource.ParseQuantity refuses one; the old parser stripped it), ASCII digits only.
@pytest.mark.parametrize(
    "text", ["", "abc", "1x", "--1", "1e999", "1" * 65, "0x10", " 7 ", "1_000", "７"]
)
def test_what_is_no_quantity(text: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("key", "found"),
    [
        ("nvidia.com/gpu", ("nvidia.com/gpu", Family.EXCLUSIVE)),
        ("nvidia.com/gpu.shared", ("nvidia.com/gpu", Family.SHARED)),
        ("nvidia.com/gpu.sliced", ("nvidia.com/gpu", Family.SLICED)),
        ("nvidia.com/gpu.sliced.memory-mib", ("nvidia.com/gpu", Family.SLICED)),
        ("nvidia.com/gpu.partitioned.mig-1g.10gb", ("nvidia.com/gpu", Family.PARTITIONED)),
        ("amd.com/gpu.sliced.units", ("amd.com/gpu", Family.SLICED)),
        ("huawei.com/npu", ("huawei.com/npu", Family.EXCLUSIVE)),
        ("device.gpustack.ai/nvidia.visibility", None),
        ("device.gpustack.ai/rdma.shared", None),
        ("nvidia.com/gpux", None),
        ("nvidia.com/gpu.slicedx", None),
        ("cpu", None),
    ],
)
def test_key_families(key: str, found: tuple[str, Family] | None) -> None:
    assert family_of(key) == found


def test_named_groups_from_selector_and_required_terms() -> None:
    terms = [
        {"matchExpressions": [{"key": f"{GROUP}nvidia-h200", "operator": "In", "values": ["true"]}]},
        {"matchExpressions": [{"key": f"{GROUP}nvidia-a10", "operator": "Exists"}]},
        {"matchExpressions": [{"key": f"{GROUP}nvidia-t4", "operator": "NotIn", "values": ["true"]},
                              {"key": f"{GROUP}nvidia-h200.count", "operator": "Gt", "values": ["1"]},
                              {"key": f"{GROUP}nvidia", "operator": "In", "values": ["true"]}]},
    ]  # fmt: skip
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }
    body = pod(
        container(), nodeSelector={f"{GROUP}amd-mi300x": "true", "disk": "ssd"}, affinity=affinity
    )
    assert named_groups(msgspec.convert(body, Pod)) == ["amd-mi300x", "nvidia-h200", "nvidia-a10"]


def test_a_group_seen_on_several_nodes_keeps_its_smallest_vram() -> None:
    smaller = msgspec.structs.replace(H200[0], memory=H200_MIB - 8)
    cards = cards_of({"a": [H200[0]], "b": [smaller], "c": H100_MIG})
    assert cards["nvidia-h200"].memory_mib == H200_MIB - 8
    assert cards["nvidia-h200"].profiles == {}
    assert set(cards["nvidia-h100-80gb-hbm3"].profiles) >= {"1g.10gb", "3g.40gb", "7g.80gb"}


@pytest.mark.parametrize("lie", [1, 64, H200_MIB // 2, H200_MIB * 2, 16 * 1024 * 1024])
def test_one_lying_node_among_honest_ones_neither_caps_nor_inflates_the_vram(lie: int) -> None:
    liar = msgspec.structs.replace(H200[0], memory=lie)
    honest = {
        f"honest-{i}": [msgspec.structs.replace(H200[0], memory=H200_MIB - i)] for i in (0, 3)
    }
    cards = cards_of({**honest, "liar": [liar]})
    assert cards["nvidia-h200"].memory_mib == H200_MIB - 3


def test_one_node_lying_about_a_partition_profile_is_outvoted() -> None:
    def lying(group: DeviceGroup) -> DeviceGroup:
        def card(a: Accelerator) -> Accelerator:
            physical = a.status.physical_sliced
            if physical is None:
                return a
            profiles = tuple(msgspec.structs.replace(p, memory_mib=1) for p in physical.profiles)
            sliced = msgspec.structs.replace(physical, profiles=profiles)
            return msgspec.structs.replace(
                a, status=msgspec.structs.replace(a.status, physical_sliced=sliced)
            )

        return msgspec.structs.replace(group, accelerators=tuple(map(card, group.accelerators)))

    cards = cards_of({"a": H100_MIG, "b": H100_MIG, "liar": [lying(g) for g in H100_MIG]})
    assert cards["nvidia-h100-80gb-hbm3"].profiles["3g.40gb"] == 40_448


def test_two_nodes_that_disagree_leave_the_vram_unknown() -> None:
    """No majority: neither node's figure is the group's, so neither can cap the other."""
    liar = msgspec.structs.replace(H200[0], memory=1)
    assert cards_of({"honest": [H200[0]], "liar": [liar]})["nvidia-h200"].memory_mib is None
    close = msgspec.structs.replace(H200[0], memory=H200_MIB - 1000)  # within 1/32: agree
    assert cards_of({"a": [H200[0]], "b": [close]})["nvidia-h200"].memory_mib == H200_MIB - 1000


def test_ledger_catalog_sees_new_groups_after_its_max_age() -> None:
    now = [0.0]
    ledger = Ledger()
    catalog = LedgerCatalog(ledger, max_age_s=1.0, clock=lambda: now[0])
    assert catalog.card("nvidia-h200") is None
    ledger.apply(events.DevicesEvent(node="n1", ts=_ts(), groups=H200))
    assert catalog.card("nvidia-h200") is None  # indexed a moment ago: not walked again yet
    now[0] = 1.0
    card = catalog.card("nvidia-h200")
    assert card is not None and card.memory_mib == H200_MIB
    assert [c.group for c in catalog.cards("nvidia")] == ["nvidia-h200"]
    assert catalog.cards("amd") == []


def _ts() -> Any:
    from datetime import UTC, datetime

    return datetime(2026, 1, 1, tzinfo=UTC)


def test_pointer_escapes_slash_and_tilde() -> None:
    assert pointer("spec", "nvidia.com/gpu.sliced.units") == "/spec/nvidia.com~1gpu.sliced.units"
    assert pointer("a~b/c") == "/a~0b~1c"


def test_mutation_is_idempotent_and_then_valid() -> None:
    from admission_helpers import apply_patch

    catalog = Catalog()
    shared = container("a", {"nvidia.com/gpu.shared": "2"})
    sliced = container(
        "b", {"nvidia.com/gpu.sliced": "1", "nvidia.com/gpu.sliced.memory-mib": "20000"}
    )
    for body in (pod(shared), pod(sliced, nodeSelector={f"{GROUP}nvidia-h200": "true"})):
        ops = [msgspec.to_builtins(op) for op in mutate(msgspec.convert(body, Pod), catalog)]
        assert ops
        once = apply_patch(body, ops)
        assert mutate(msgspec.convert(once, Pod), catalog) == []
        assert validate(msgspec.convert(once, Pod), catalog) == []
        assert validate(msgspec.convert(body, Pod), catalog) != []


@pytest.mark.parametrize(
    ("doc", "units"), [("README.md", "800000"), ("docs/requests.md", "799994")]
)
def test_the_documented_pod_is_admitted_with_the_documented_units(doc: str, units: str) -> None:
    import re
    from pathlib import Path

    import yaml
    from admission_helpers import apply_patch

    text = (Path(__file__).parents[3] / doc).read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.DOTALL) if "half-an-h200" in b]
    body = yaml.safe_load(block)
    for c in body["spec"]["containers"]:  # the API server defaults requests from limits
        c["resources"]["requests"] = dict(c["resources"]["limits"])
    catalog = Catalog()
    ops = [msgspec.to_builtins(op) for op in mutate(msgspec.convert(body, Pod), catalog)]
    admitted = apply_patch(body, ops)
    assert validate(msgspec.convert(admitted, Pod), catalog) == []
    resources = admitted["spec"]["containers"][0]["resources"]
    assert resources["limits"]["nvidia.com/gpu.sliced.units"] == units
    assert resources["requests"]["nvidia.com/gpu.sliced.units"] == units
    assert resources["limits"]["nvidia.com/gpu.sliced.cores-percentage"] == "40"
    if units == "799994":
        assert '"value": "799994"' in text  # the patch the doc shows


@pytest.mark.anyio
async def test_with_cert_dir_the_bundle_is_its_ca_else_its_certificate(tmp_path: Any) -> None:
    from typing import cast

    from controlplane.admission import certificates
    from controlplane.admission.webhooks import WebhookSettings
    from controlplane.k8s.client import KubeClient
    from kit.serving import HttpsSettings

    ca, ca_key = certificates.new_authority()
    cert, key = certificates.issue(ca, ca_key, ["gpustack-operator-worker.ns.svc"])
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    https = HttpsSettings(cert_dir=str(tmp_path))
    no_api = cast(KubeClient, None)  # a given certificate needs no Secret
    async with certificates.serving_identity(no_api, https, WebhookSettings()) as identity:
        assert identity.https == https and identity.ca_bundle == cert
    (tmp_path / "ca.crt").write_bytes(ca)
    async with certificates.serving_identity(no_api, https, WebhookSettings()) as identity:
        assert identity.ca_bundle == ca
