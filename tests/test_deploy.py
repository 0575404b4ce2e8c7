"""The files for operators who run Prometheus and Grafana (``deploy/``): every metric the alerting rules and
the dashboard query is one a running daemon exports, with a type that fits how it is queried.

``promtool check rules`` and ``promtool test rules`` run in ``scripts/test`` (Debian's ``prometheus``
package, installed by ``.ci/run``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml  # type: ignore[import-untyped]
from prometheus_client.parser import text_string_to_metric_families

from procurd.sandbox import Sandbox, SandboxConfig
from support import running_daemon, settings_for

DEPLOY = Path(__file__).parent.parent / "deploy"
RULES = DEPLOY / "prometheus" / "procurd-rules.yml"
DASHBOARD = DEPLOY / "grafana" / "procurd.json"
METRIC = re.compile(r"\b(procurd_[a-z0-9_]+)\b")
# Series Prometheus makes of one family, by the family's type.
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def rule_expressions() -> list[str]:
    document = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [str(rule["expr"]) for group in document["groups"] for rule in group["rules"]]


def dashboard_expressions() -> list[str]:
    document = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found = [target["expr"] for panel in document["panels"] for target in panel.get("targets", [])]
    for variable in document["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["definition"])
    return found


@pytest.fixture
async def exported(database_url: str) -> dict[str, str]:
    """The metric families a daemon's ``/metrics`` answers, with their types (scraped over HTTP)."""
    async with Sandbox(SandboxConfig(products=1, skus_per_product=1)) as sandbox:
        settings = settings_for(database_url, ("main", sandbox))
        async with running_daemon(settings), aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{settings.server.admin_port}/metrics"
            async with session.get(url) as answer:
                assert answer.status == 200
                text = await answer.text()
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def series_names(families: dict[str, str]) -> dict[str, str]:
    """Every series name Prometheus stores from ``families``: its family's type."""
    return {name + suffix: kind for name, kind in families.items() for suffix in SUFFIXES.get(kind, ("",))}


def used(expressions: list[str]) -> set[str]:
    return {name for expression in expressions for name in METRIC.findall(expression)}


@pytest.mark.parametrize("source", ["rules", "dashboard"])
async def test_every_queried_metric_is_exported(exported: dict[str, str], source: str) -> None:
    """Each ``procurd_*`` series in the rules (or the dashboard) is a series of a family the daemon exports:
    counters as ``_total``, histograms as ``_bucket``/``_sum``/``_count``, gauges as they are."""
    expressions = rule_expressions() if source == "rules" else dashboard_expressions()
    assert expressions
    for expression in expressions:
        assert METRIC.search(expression) or "up{" in expression, expression
    unknown = used(expressions) - set(series_names(exported))
    assert unknown == set(), f"{source} query what the daemon does not export: {sorted(unknown)}"


def test_rules_hold_the_suggested_alerts_and_the_runway() -> None:
    """The rules file holds the suggested alerts of docs/operating.md (health, exceptions, a stalled queue, a
    stale catalogue, rejected callbacks, a dead instance, no daemon at all) and the wallet's runway."""
    names = {
        rule["alert"]
        for group in yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
        for rule in group["rules"]
    }
    assert {
        "ProcurdUpstreamUnhealthy", "ProcurdOpenExceptions", "ProcurdQueueStalled", "ProcurdCatalogSyncStale",
        "ProcurdCallbacksRejected", "ProcurdInstanceDown", "ProcurdTargetDown", "ProcurdNoDaemonAlive",
        "ProcurdWalletRunway",
    } <= names  # fmt: skip
    runway = used([e for e in rule_expressions() if "runway" in e])
    assert runway == {"procurd_upstream_runway_hours", "procurd_upstream_runway_alert_hours"}


def test_the_dashboard_is_a_grafana_dashboard() -> None:
    """The dashboard parses, every panel has a unique id and a place on the grid, and each query goes to the
    data source chosen when it is imported."""
    document: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert (document["uid"], document["title"]) == ("procurd", "procurd")
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))
    for panel in document["panels"]:
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"}
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    titles = " ".join(panel["title"] for panel in document["panels"])
    assert "Runway" in titles
    assert "Wallet balance" in titles
