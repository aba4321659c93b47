"""The Grafana dashboard and the `monitoring` compose profile (deploy/).

Every metric a dashboard query names is one a real relay process exports on /metrics
(scraped after it served connections, REQs, stored, refused and live events, with a read
replica configured), and every label a query filters or groups by is one that metric
carries. No Grafana or Prometheus runs here: the files are checked against each other and
against the relay.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgspec
import yaml
from nostr_client import Client
from relay_fixtures import create_database

from engram.nip01 import sign_event
from relay.config import Settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "engram-relay.json"
TARGET_LABELS = {"instance", "job"}  # added by Prometheus, not by the relay
HISTOGRAM_SAMPLES = ("_bucket", "_sum", "_count")

_RANGE = re.compile(r"\[[^\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*(\{[^}]*\})?")
_MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*"[^"]*"')
_LABEL_VALUES = re.compile(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,\s*(\w+)\s*\)")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "on", "ignoring", "group_left"}
_KEYWORDS |= {"group_right", "by", "without"}


def selectors(expr: str) -> tuple[list[tuple[str, set[str]]], set[str]]:
    """A PromQL expression's metric selectors, [(metric name, labels matched)], and the
    labels it groups by. Enough PromQL for dashboards: functions are names before `(`."""
    grouped = {g.strip() for m in _GROUPING.finditer(expr) for g in m[1].split(",") if g.strip()}
    text = _GROUPING.sub(" ", _RANGE.sub(" ", expr))
    found: list[tuple[str, set[str]]] = []
    for m in _SELECTOR.finditer(text):
        rest = text[m.end() :].lstrip()
        if m[1] in _KEYWORDS or (m[2] is None and rest.startswith("(")):
            continue  # an operator keyword or a function name
        found.append((m[1], set(_MATCHER.findall(m[2] or ""))))
    return found, grouped


def test_selectors_parser() -> None:
    found, grouped = selectors(
        "histogram_quantile(0.99, sum by (tenant, le) (rate(engram_req_duration_seconds_bucket"
        '{tenant=~"$tenant",instance=~"$instance"}[$__rate_interval]))) / sum(engram_x) == 1'
    )
    assert found == [
        ("engram_req_duration_seconds_bucket", {"tenant", "instance"}),
        ("engram_x", set()),
    ]
    assert grouped == {"tenant", "le"}


def dashboard_queries() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", ())]
    assert len(exprs) > 20
    return exprs


def variable_queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    out = []
    for var in doc["templating"]["list"]:
        if var["type"] == "query":
            m = _LABEL_VALUES.fullmatch(var["query"]["query"])
            assert m, var
            out.append((m[1], m[2]))
    return out


def scrape(url: str) -> tuple[dict[str, str], dict[str, set[str]]]:
    """/metrics as ({family: type}, {sample name: labels carried})."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    types: dict[str, str] = {}
    labels: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            types[name] = kind
        elif line and not line.startswith("#"):
            m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})?\s", line)
            assert m, line
            carried = set(re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m[3] or ""))
            labels.setdefault(m[1], set()).update(carried)
    return types, labels


def exported(name: str, types: dict[str, str], samples: dict[str, set[str]]) -> bool:
    if name in types or name in samples:
        return True
    for suffix in HISTOGRAM_SAMPLES:  # a histogram family's _bucket/_sum/_count
        if name.endswith(suffix) and types.get(name.removesuffix(suffix)) == "histogram":
            return True
    return name.endswith("_total") and types.get(name.removesuffix("_total")) == "counter"


async def test_every_dashboard_metric_is_exported_by_the_relay(start_relay, pg_server_url):
    not_a_standby = await create_database(pg_server_url)  # a replica that is not one
    rp = start_relay(env={"ENGRAM_REPLICA_URLS": not_a_standby})
    sk = (0xDA5B0A4D).to_bytes(32, "big")
    async with await Client.connect(rp.url) as live, await Client.connect(rp.url) as c:
        _, end = await live.req("live", {})
        assert end[0] == "EOSE"
        note = sign_event(sk, int(time.time()), 1, [], "for the dashboard", bytes(32))
        assert (await c.publish(note))[2] is True  # stored, group-committed, fanned out
        assert (await live.recv())[2]["id"] == note.id
        forged = msgspec.structs.replace(note, content="forged")
        assert (await c.publish(forged))[2] is False  # refused: invalid
        assert await c.query({"ids": [note.id]})  # a REQ answered
        types, samples = scrape(rp.http_url)

    queries = [selectors(e) for e in dashboard_queries()]
    queries += [([(metric, {label})], set()) for metric, label in variable_queries()]
    names: set[str] = set()
    for found, grouped in queries:
        assert found, "a query without a metric"
        for name, matched in found:
            assert name.startswith("engram_"), name
            assert exported(name, types, samples), f"the relay does not export {name}"
            names.add(name)
            carried = samples.get(name) or set()
            for label in (matched | grouped) - TARGET_LABELS - {"le"}:
                assert label in carried, f"{name} has no label {label!r}"
            if "tenant" in carried:  # per tenant where the metric has the label
                assert "tenant" in matched, f"{name} is not filtered by the Tenant selector"
    # the list: each is on the dashboard
    for wanted in (
        "engram_connections",
        "engram_events_total",
        "engram_messages_total",
        "engram_req_duration_seconds_bucket",
        "engram_live_events_total",
        "engram_slow_consumer_drops_total",
        "engram_send_queue_bytes",
        "engram_write_batch_size_bucket",
        "engram_db_pool_connections",
        "engram_replica_lag_seconds",
    ):
        assert wanted in names, wanted


def test_dashboard_panels_use_the_datasource_and_node_variables() -> None:
    doc = json.loads(DASHBOARD.read_text())
    assert {v["name"] for v in doc["templating"]["list"]} == {"datasource", "instance", "tenant"}
    for panel in doc["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            found, _ = selectors(target["expr"])
            for name, matched in found:
                assert "instance" in matched, (panel["title"], name)


def test_compose_monitoring_profile_starts_prometheus_and_grafana() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    for name in ("postgres", "relay"):
        assert "profiles" not in services[name]  # monitoring stays optional
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["monitoring"]

    def mounts(service: dict[str, Any]) -> dict[str, Path]:
        """container path -> host path (relative to deploy/) of each bind mount."""
        out = {}
        for spec in service["volumes"]:
            host, container = str(spec).split(":")[:2]
            if host.startswith("./"):
                assert (DEPLOY / host).exists(), host
                out[container] = DEPLOY / host
        return out

    # Prometheus reads prometheus.yml, which scrapes the relay service on its port
    prom_mounts = mounts(prometheus)
    config_path = next(
        a.split("=", 1)[1] for a in prometheus["command"] if a.startswith("--config.file=")
    )
    config = yaml.safe_load(prom_mounts[config_path].read_text())
    (job,) = config["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host in services and int(port) == Settings().port

    # Grafana: the datasource is that Prometheus; the dashboard provider reads the folder
    # the dashboard JSON is mounted into
    g_mounts = mounts(grafana)
    provisioning = g_mounts["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())[
        "datasources"
    ]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "engram-relay.yaml").read_text())[
        "providers"
    ]
    folder = provider["options"]["path"]
    dashboards = [host for container, host in g_mounts.items() if container.startswith(folder)]
    assert dashboards == [DASHBOARD]
    published = grafana["ports"][0]
    assert published.startswith("${GRAFANA_BIND:-127.0.0.1}:")  # not on the internet
    assert "GF_SECURITY_ADMIN_PASSWORD" in grafana["environment"]
