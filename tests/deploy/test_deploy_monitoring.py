"""The monitoring overlay: a ServiceMonitor over the services' HTTPS /metrics, the RBAC a
scraper needs, and a Grafana dashboard whose every query names metrics the agents export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from deploy_helpers import BASE, REPO, find
from promselect import Series, label_values, scrape_series, select, selectors

OVERLAY = "deploy/overlays/monitoring"
DASHBOARD = REPO / OVERLAY / "grafana-dashboard.json"
METRIC = re.compile(r"\b(gpustack_[a-z_]+)")


def _documented() -> set[str]:
    """Every metric docs/metrics.md names (tests/gpustack_operator/test_docs_metrics.py ties
    that list to what the services register)."""
    return set(re.findall(r"`(gpustack_[a-z_]+)`", (REPO / "docs" / "metrics.md").read_text()))


def _queries(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]] + [
        v["definition"] for v in dashboard["templating"]["list"] if "definition" in v
    ]


def test_every_query_names_an_exported_metric() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    names = {m for q in _queries(dashboard) for m in METRIC.findall(q)}
    # the queries name series as /metrics writes them (counters with _total), as the docs do
    assert names - _documented() == set()
    # the headline DCGM-style panels are there
    assert {"gpustack_accelerator_utilization_percent", "gpustack_accelerator_last_xid",
            "gpustack_accelerator_energy_millijoules_total"} <= names  # fmt: skip
    assert "gpustack_accelerator_gr_engine_active" in names  # the only activity of a MIG card


_FILTERS = ('Hostname=~"$node"', 'gpu=~"$gpu"', 'namespace=~"$namespace"', 'pod=~"$pod"')


def test_every_panel_reads_the_chosen_data_source_node_gpu_namespace_and_pod() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert set(variables) == {"datasource", "node", "gpu", "namespace", "pod"}
    for name in ("node", "gpu", "namespace", "pod"):
        chosen = variables[name]
        assert chosen["definition"] == chosen["query"]["query"]
        assert chosen["definition"].endswith(f", {'Hostname' if name == 'node' else name})")
        # "All" must keep the cards nobody holds (namespace="", pod=""): a regex matching "".
        assert chosen["multi"] and chosen["includeAll"] and chosen["allValue"] == ".*"
    # Each narrows by the ones before it, as a user picks them.
    assert 'Hostname=~"$node"' in variables["gpu"]["definition"]
    assert 'namespace=~"$namespace"' in variables["pod"]["definition"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
            if "gpustack_accelerator_" in target["expr"]:
                selectors = re.findall(r"gpustack_accelerator_\w+\{([^}]*)\}", target["expr"])
                assert selectors, panel["title"]
                for selector in selectors:
                    assert all(f in selector for f in _FILTERS), (panel["title"], selector)


def test_the_dashboard_ships_as_a_configmap_grafana_picks_up(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    config = find(trees[OVERLAY], "ConfigMap", "gpustack-operator-grafana-dashboard")
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["grafana-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def _selected(monitor: dict[str, Any], service: dict[str, Any]) -> bool:
    labels = service["metadata"].get("labels", {})
    selector = monitor["spec"]["selector"]
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    return all(
        labels.get(e["key"]) in e["values"]
        for e in selector.get("matchExpressions", [])
        if e["operator"] == "In"
    )


def test_the_servicemonitor_scrapes_each_service_on_its_https_port(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    objs = trees[OVERLAY]
    monitor = find(objs, "ServiceMonitor", "gpustack-operator")
    services = [o for o in trees[BASE] if o["kind"] == "Service"]
    chosen = {s["metadata"]["name"] for s in services if _selected(monitor, s)}
    assert chosen == {"gpustack-operator-worker", "gpustack-operator-device-manager",
                      "gpustack-operator-model-manager"}  # fmt: skip
    (endpoint,) = monitor["spec"]["endpoints"]
    for name in chosen:
        ports = find(trees[BASE], "Service", name)["spec"]["ports"]
        assert endpoint["port"] in {p["name"] for p in ports}, name
        annotations = find(trees[BASE], "Service", name)["metadata"]["annotations"]
        assert annotations["prometheus.io/scheme"] == endpoint["scheme"] == "https"
        assert annotations["prometheus.io/path"] == endpoint["path"]
    # The current API (`authorization`), not the deprecated bearerTokenFile/bearerTokenSecret.
    assert not {"bearerTokenFile", "bearerTokenSecret"} & set(endpoint)
    auth = endpoint["authorization"]
    assert auth["type"] == "Bearer"
    secret = find(objs, "Secret", auth["credentials"]["name"])
    assert secret["metadata"]["namespace"] == monitor["metadata"]["namespace"]  # operator's rule
    assert secret["type"] == "kubernetes.io/service-account-token"
    assert auth["credentials"]["key"] == "token"  # the key the token controller writes
    assert endpoint["honorLabels"] is True  # the accelerator series' own pod/namespace


def test_the_scraper_may_get_metrics_and_nothing_else(
    trees: dict[str, list[dict[str, Any]]],
) -> None:
    objs = trees[OVERLAY]
    role = find(objs, "ClusterRole", "gpustack-operator-metrics-reader")
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    # Bound to the overlay's own scraper account (whose token the ServiceMonitor sends), never
    # to a guessed Prometheus account; nothing else binds that account.
    monitor = find(objs, "ServiceMonitor", "gpustack-operator")
    secret = find(
        objs, "Secret", monitor["spec"]["endpoints"][0]["authorization"]["credentials"]["name"]
    )
    account = secret["metadata"]["annotations"]["kubernetes.io/service-account.name"]
    assert find(objs, "ServiceAccount", account)["metadata"]["namespace"] == "gpustack-system"
    bindings = [o for o in objs if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}]
    to_role = [b for b in bindings if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert [b["subjects"] for b in to_role] == [
        [{"kind": "ServiceAccount", "name": account, "namespace": "gpustack-system"}]
    ]
    assert not [b for b in bindings if b not in to_role and any(
        s.get("name") == account for s in b["subjects"])]  # fmt: skip


def test_the_json_file_is_what_grafana_imports() -> None:
    dashboard = json.loads(Path(DASHBOARD).read_text())
    assert dashboard["uid"] == "gpustack-accelerators" and dashboard["schemaVersion"] >= 36
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["w"] > 0 and grid["h"] > 0


class _Fixed:
    """A collector of families already made (the agent's own collector reads live sources)."""

    def __init__(self, families: list[Any]) -> None:
        self.families = families

    def collect(self) -> list[Any]:
        return self.families


def _fleet_scrape() -> list[Series]:
    """Two nodes of two cards each, as Prometheus stores their scrapes; node-a's card 1 is held
    by ai/llm (container main). Values for every field the dashboard reads."""
    from prometheus_client import CollectorRegistry, generate_latest

    from agent.serve import metrics
    from bus import devices

    series: list[Series] = []
    for host in ("node-a", "node-b"):
        cards = tuple(
            devices.Accelerator(id=f"GPU-{host}-{i}", index=i, physical_indexes=(i,),
                                status=devices.AcceleratorStatus(unhealthy=False))
            for i in range(2)
        )  # fmt: skip
        group = devices.DeviceGroup(id="nvidia-h100", manufacturer="nvidia", name="NVIDIA H100",
                                    driver_version="580.82.07", accelerators=cards)  # fmt: skip
        samples = tuple(
            devices.AcceleratorSample(
                id=c.id, unhealthy=False, memory=81559, memory_usage=1000 + c.index,
                cores_utilization=40, temperature=50, memory_temperature=60, power_usage=300,
                sm_clock=1980, energy=5, pcie_tx_throughput=10, pcie_rx_throughput=20,
                nvlink_tx=7, nvlink_rx=8, remapped_rows_uncorrectable=0, row_remap_failed=False,
                gr_engine_active=0.5, tensor_active=0.25,
            )
            for c in cards
        )  # fmt: skip
        view = [devices.MonitorSample(manufacturer="nvidia", timestamp="t", accelerators=samples)]
        holders = {"GPU-node-a-1": [("ai", "llm", "main")]} if host == "node-a" else {}
        families = metrics.accelerator_families(host, [group], view, holders=holders)
        registry = CollectorRegistry()
        registry.register(_Fixed(families))  # type: ignore[arg-type]
        text = generate_latest(registry).decode()
        series += scrape_series(text, {"instance": f"{host}:32443", "job": "gpustack-operator"})
    return series


def _accelerator_selectors(dashboard: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(panel title, metric, matchers) of every per-card selector outside the MIG panels."""
    return [
        (panel["title"], metric, body)
        for panel in dashboard["panels"]
        for target in panel["targets"]
        for metric, body in selectors(target["expr"])
        if metric.startswith("gpustack_accelerator_") and 'GPU_I_ID!=""' not in body
    ]


def test_the_dashboard_variables_and_panels_select_series_from_a_scrape() -> None:
    """Against what the agents export: the variables offer the nodes, GPUs, namespaces and pods
    there are; with All every panel has data; picking a pod narrows every panel to its card."""
    dashboard = json.loads(DASHBOARD.read_text())
    definitions = {
        v["name"]: v["definition"] for v in dashboard["templating"]["list"] if "definition" in v
    }
    series = _fleet_scrape()
    every = dict.fromkeys(("node", "gpu", "namespace", "pod"), ".*")  # allValue
    assert label_values(series, definitions["node"], every) == ["node-a", "node-b"]
    assert label_values(series, definitions["gpu"], every) == ["0", "1"]
    assert label_values(series, definitions["namespace"], every) == ["ai"]
    assert label_values(series, definitions["pod"], {**every, "namespace": "ai"}) == ["llm"]
    assert label_values(series, definitions["pod"], {**every, "namespace": "other"}) == []

    checked = _accelerator_selectors(dashboard)
    assert len({title for title, _, _ in checked}) >= 12
    for title, metric, body in checked:
        picked = select(series, metric, body, every)
        cards = {f"GPU-{h}-{i}" for h in ("node-a", "node-b") for i in (0, 1)}
        expected = {"GPU-node-a-1"} if 'pod!=""' in body else cards  # the held-cards panels
        assert {labels["UUID"] for _, labels in picked} == expected, (title, metric)
        held = select(series, metric, body, {**every, "namespace": "ai", "pod": "llm"})
        assert {labels["UUID"] for _, labels in held} == {"GPU-node-a-1"}, (title, metric)
        one = select(series, metric, body, {**every, "node": "node-a", "gpu": "1"})
        assert {labels["UUID"] for _, labels in one} == {"GPU-node-a-1"}, (title, metric)
        other = select(series, metric, body, {**every, "node": "node-b", "gpu": "0"})
        assert {u["UUID"] for _, u in other} == expected & {"GPU-node-b-0"}, (title, metric)
