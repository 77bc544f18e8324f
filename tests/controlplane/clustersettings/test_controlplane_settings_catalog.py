"""The Setting catalog and its store: seeding, backfill, validation, masking, refresh.

The store is exercised against the stateful fake API (the Secret ``gpustack-settings``) and a
real nats-server (the bus KV under ``--kubeconfig=none``).
"""

from __future__ import annotations

import base64
from typing import Any

import pytest
from controlplane_fakeapi import FakeApi, fake_api

from bus import connection, kv
from bus.testing import nats_server, settings_for
from controlplane import errors
from controlplane.clustersettings import catalog as settingscatalog
from controlplane.clustersettings.catalog import BY_NAME, CATALOG, InvalidSetting
from controlplane.clustersettings.source import KvBackend, SecretBackend, SettingsSource
from controlplane.k8s.client import KubeSettings, open_client
from controlplane.stores import storespec

SECRETS = "api/v1/secrets"
NS = "gpustack-system"


def test_every_entry_has_a_valid_default_and_a_typed_field() -> None:
    values = settingscatalog.validate_all({})
    for entry in CATALOG:
        assert entry.env == "GPUSTACK_" + entry.name.upper().replace("-", "_")
        assert getattr(values, entry.field) == entry.convert(entry.default)


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("model-artifact-https-proxy", "http://user:pw@proxy:3128", "credentials"),
        ("model-artifact-https-proxy", "http://user@proxy:3128", "credentials"),
        ("model-artifact-https-proxy", "socks5://proxy:1080", "http(s) URL"),
        ("model-store-high-watermark", "96", "[2, 95]"),
        ("model-store-low-watermark", "0", "[1, 94]"),
        ("model-store-download-concurrency", "65", "[1, 64]"),
        ("model-store-download-bandwidth", "-1", "non-negative"),
        ("model-artifact-revalidate-interval", "30s", "at least 1m"),
        ("model-artifact-huggingface-endpoint", "ftp://hub", "http(s) URL"),
        ("model-artifact-huggingface-endpoint", "http://[::1", "Invalid IPv6 URL"),
        ("model-artifact-huggingface-endpoint", "http://hub:99999", "out of range"),
        ("model-artifact-https-proxy", "http://proxy:port", "could not be cast"),
        ("model-artifact-https-proxy", "http://u:s3cret@proxy:99999", "u:REDACTED@proxy"),
        ("workload-fit-affinity", "maybe", "boolean"),
        ("model-artifact-ca-bundle", "Not_A_Name", "ConfigMap"),
        ("no-such-setting", "x", "catalog is fixed"),
        # One parser per type, Go's forms exactly (each of these was accepted before).
        ("model-store-download-concurrency", " 8", "not an integer"),
        ("model-store-download-concurrency", "８", "not an integer"),
        ("model-store-download-concurrency", "０８", "not an integer"),
        ("model-store-download-concurrency", "1_6", "not an integer"),
        ("model-store-high-watermark", "80\n", "not an integer"),
        ("workload-fit-affinity", "yes", "boolean"),
        ("workload-fit-affinity", " true", "boolean"),
        ("workload-fit-affinity", "on", "boolean"),
        ("model-store-download-bandwidth", " 1Mi", "not a quantity"),
        ("model-artifact-revalidate-interval", "1h ", "not a duration"),
        (
            "model-artifact-huggingface-endpoint",
            "https://hub.example/" + "a" * 2029,
            "at most 2048",
        ),
        (
            "model-artifact-huggingface-endpoint",
            "https://hub.example/" + "a" * 2**20,
            "at most 4096",
        ),
        ("model-artifact-no-proxy", "a," * 2049, "at most 4096"),
    ],
)
def test_bad_texts_are_refused_naming_the_setting(name: str, text: str, needle: str) -> None:
    with pytest.raises(InvalidSetting) as caught:
        settingscatalog.check(name, text)
    assert needle in str(caught.value) and name in str(caught.value)
    assert "s3cret" not in str(caught.value)
    assert len(str(caught.value)) < 400  # a refused megabyte is not echoed back


@pytest.mark.parametrize(
    ("name", "text", "value"),
    [
        ("model-store-download-concurrency", "+8", 8),
        ("workload-fit-affinity", "1", True),
        ("workload-fit-affinity", "F", False),
        ("workload-fit-affinity", "TRUE", True),
        ("model-artifact-revalidate-interval", "1h30m", 5400.0),
        ("model-artifact-revalidate-interval", "1.5h", 5400.0),
        ("model-artifact-huggingface-endpoint", "https://hub.example/" + "a" * 2028, None),
    ],
)
def test_go_forms_are_read_as_go_reads_them(name: str, text: str, value: object) -> None:
    """strconv.ParseInt/ParseBool and time.ParseDuration forms; a URL of exactly 2048 passes."""
    got = settingscatalog.check(name, text)
    assert got == (text if value is None else value)


def test_low_must_stay_below_high() -> None:
    with pytest.raises(InvalidSetting, match="below"):
        settingscatalog.validate_all({"model-store-low-watermark": "85"})
    values, problems = settingscatalog.parse({"model-store-low-watermark": "85"})
    assert (values.model_store_low_watermark, values.model_store_high_watermark) == (70, 80)
    assert problems


def test_seed_reads_the_environment_and_refuses_a_proxy_with_credentials() -> None:
    data = settingscatalog.seed({"GPUSTACK_MODEL_STORE_DOWNLOAD_BANDWIDTH": "10Mi"})
    assert data["model-store-download-bandwidth"] == "10Mi"
    assert settingscatalog.parse(data)[0].model_store_download_bandwidth == 10 * 2**20
    with pytest.raises(InvalidSetting, match="credentials"):
        settingscatalog.seed({"GPUSTACK_MODEL_ARTIFACT_HTTPS_PROXY": "https://a:b@p:8443"})


def test_a_bad_stored_text_falls_back_to_the_default_and_says_so() -> None:
    values, problems = settingscatalog.parse({"model-store-download-concurrency": "999"})
    assert values.model_store_download_concurrency == 8
    assert len(problems) == 1 and "model-store-download-concurrency" in problems[0]


def test_sensitive_values_are_masked_when_set() -> None:
    proxy = settingscatalog.BY_NAME["model-artifact-https-proxy"]
    assert settingscatalog.shown(proxy, "http://proxy:3128") == settingscatalog.MASK
    assert settingscatalog.shown(proxy, "") == ""
    plain = settingscatalog.BY_NAME["model-store-high-watermark"]
    assert settingscatalog.shown(plain, "80") == "80"


def test_chain_fields_name_the_chain_settings_struct() -> None:
    """Every setting the chain reads reaches a field of its struct, whose default is the
    catalog's (one default, written once)."""
    from controlplane.chain.settings import ChainSettings

    values = settingscatalog.parse({"workload-fit-affinity": "false"})[0]
    fields = settingscatalog.chain_fields(values, manage_kueue=False)
    assert fields == {
        "workload_fit_affinity": False,
        "node_management_manual": False,
        "instance_type_mixed_on_node": True,
        "instance_type_derived_from_node": True,
        "instance_type_drain_when_no_flavors": True,
        "instance_type_aware_cpu_manufacturer": False,
        "manage_kueue": False,
    }
    defaults = ChainSettings()
    for name in settingscatalog.CHAIN_SETTINGS:
        field = BY_NAME[name].field
        assert getattr(defaults, field) == getattr(settingscatalog.DEFAULTS, field), name
    assert not any(BY_NAME[name].inert for name in settingscatalog.CHAIN_SETTINGS)


def _secret_data(fake: FakeApi) -> dict[str, str]:
    body: dict[str, Any] = fake.get(SECRETS, settingscatalog.SECRET_NAME, NS)
    return {k: base64.b64decode(v).decode() for k, v in body["data"].items()}


@pytest.mark.anyio
async def test_first_start_seeds_the_secret_later_starts_only_backfill() -> None:
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        seed = settingscatalog.seed({"GPUSTACK_MODEL_STORE_HIGH_WATERMARK": "90"})
        first = SettingsSource(SecretBackend(api, NS), seed)
        await first.prepare()
        assert _secret_data(fake)["model-store-high-watermark"] == "90"
        assert first.values.model_store_high_watermark == 90

        # A user edits one setting and an older version lacked another: the next start keeps
        # the edit and adds only the missing one.
        data = _secret_data(fake)
        data["model-store-high-watermark"] = "85"
        del data["node-management-manual"]
        encoded = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
        fake.objects[(SECRETS, NS, settingscatalog.SECRET_NAME)]["data"] = encoded
        again = SettingsSource(SecretBackend(api, NS), settingscatalog.seed({}))
        await again.prepare()
        stored = _secret_data(fake)
        assert stored["model-store-high-watermark"] == "85"
        assert stored["node-management-manual"] == "false"
        assert again.values.model_store_high_watermark == 85


@pytest.mark.anyio
async def test_a_change_is_picked_up_by_refresh_and_announced() -> None:
    async with fake_api() as (_, url), open_client(KubeSettings.for_tests(url)) as api:
        source = SettingsSource(SecretBackend(api, NS), settingscatalog.seed({}))
        await source.prepare()
        assert await source.refresh() is False
        async with source.changes() as changes:
            patch = {"data": {"workload-fit-affinity": base64.b64encode(b"false").decode()}}
            await api.patch(source_ref(), patch)
            assert await source.refresh() is True
            seen = await changes.__anext__()
        assert seen.data["workload-fit-affinity"] == "false"
        assert source.values.workload_fit_affinity is False


def source_ref() -> Any:
    from controlplane.resources import SECRETS as SECRET_RESOURCE
    from controlplane.resources import Ref

    return Ref(resource=SECRET_RESOURCE, name=settingscatalog.SECRET_NAME, namespace=NS)


@pytest.mark.anyio
async def test_writes_are_validated_and_conditional() -> None:
    async with fake_api() as (fake, url), open_client(KubeSettings.for_tests(url)) as api:
        source = SettingsSource(SecretBackend(api, NS), settingscatalog.seed({}))
        await source.prepare()
        await source.write("model-store-download-concurrency", "16")
        assert _secret_data(fake)["model-store-download-concurrency"] == "16"
        assert source.values.model_store_download_concurrency == 16
        with pytest.raises(InvalidSetting, match="credentials"):
            await source.write("model-artifact-https-proxy", "http://u:p@proxy:1")
        with pytest.raises(InvalidSetting, match="not editable"):
            await source.write("model-artifact-delivery-mode", "Node")
        # Nothing oversized or loosely typed reaches the Secret (a 1 MB URL was stored before).
        for name, text in (
            ("model-artifact-huggingface-endpoint", "https://hub.example/" + "a" * 2**20),
            ("model-store-download-concurrency", " 8"), ("instance-type-mixed-on-node", "yes"),
        ):  # fmt: skip
            with pytest.raises(InvalidSetting):
                await source.write(name, text)
        assert _secret_data(fake)["model-artifact-huggingface-endpoint"] == "https://huggingface.co"
        assert _secret_data(fake)["model-store-download-concurrency"] == "16"
        other = SettingsSource(SecretBackend(api, NS), settingscatalog.seed({}))
        await other.prepare()
        await other.write("model-store-download-concurrency", "4")
        with pytest.raises(errors.Conflict):  # read before the other's write
            await source.write("model-store-download-concurrency", "32")


@pytest.mark.anyio
async def test_without_a_cluster_the_settings_live_in_the_bus_kv(tmp_path: Any) -> None:
    async with nats_server(tmp_path) as server:
        bus = settings_for(server)
        async with connection.connect(bus, name="worker") as conn:
            bucket = await kv.open_bucket(conn, kv.LEDGER_BUCKET)
            source = SettingsSource(KvBackend(bucket, NS), settingscatalog.seed({}))
            await source.prepare()
            await source.write("node-management-manual", "true")
            again = SettingsSource(KvBackend(bucket, NS), settingscatalog.seed({}))
            await again.prepare()
            assert again.values.node_management_manual is True


@pytest.mark.anyio
async def test_a_worker_without_a_cluster_keeps_its_settings_in_the_bus(tmp_path: Any) -> None:
    import anyio
    import msgspec
    from test_controlplane_worker import worker_settings

    from controlplane.worker import running

    async with nats_server(tmp_path) as server, anyio.create_task_group() as tg:
        bus = settings_for(server)
        conf = msgspec.structs.replace(
            worker_settings(bus, None),
            settings_seed=settingscatalog.seed({"GPUSTACK_NODE_MANAGEMENT_MANUAL": "true"}),
        )
        worker = await tg.start(running.run, conf)
        async with connection.connect(bus, name="reader") as conn:
            bucket = await kv.open_bucket(conn, kv.LEDGER_BUCKET)
            stored = await KvBackend(bucket, "gpustack-system").load()
        tg.cancel_scope.cancel()
    assert stored is not None and stored.data["node-management-manual"] == "true"
    assert worker.settings is not None and worker.settings.values.node_management_manual is True


def test_the_settings_table_in_the_docs_is_the_catalog() -> None:
    """docs/settings.md lists every setting once, with its default, and marks exactly the inert
    ones (stored, never read: the API says so too) with "—" in its "Read by" column."""
    from pathlib import Path

    text = (Path(__file__).parents[3] / "docs" / "settings.md").read_text()
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[0].strip("`") in BY_NAME:
            rows[cells[0].strip("`")] = cells
    assert set(rows) == {e.name for e in CATALOG}
    assert {n for n, cells in rows.items() if cells[3] == "—"} == {
        e.name for e in CATALOG if e.inert
    }
    assert {n for n, cells in rows.items() if cells[3] == "the Kueue chain"} == set(
        settingscatalog.CHAIN_SETTINGS
    )
    for entry in CATALOG:
        shown = rows[entry.name][1].strip("`")
        assert shown == (entry.default or "empty"), entry.name


def test_peer_sync_is_a_boolean_setting_that_reaches_the_store_spec() -> None:
    assert settingscatalog.check("model-store-peer-sync", "false") is False
    with pytest.raises(settingscatalog.InvalidSetting):
        settingscatalog.check("model-store-peer-sync", "sometimes")
    values = settingscatalog.parse({"model-store-peer-sync": "false"})[0]
    assert storespec.from_settings(values)["download"]["peerSync"] is False
    assert storespec.from_settings(settingscatalog.DEFAULTS)["download"]["peerSync"] is True
