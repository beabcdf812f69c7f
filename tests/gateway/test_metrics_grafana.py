"""The Grafana dashboard beside the Helm chart queries exactly what the broker exports: every
metric name in its queries is a series the registry writes, and every metric the registry
exports is on some panel. (A renamed metric otherwise leaves an empty panel nobody notices.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.service import Broker
from broker.settings import Settings

DASHBOARD = Path(__file__).resolve().parents[2] / "helm" / "grafana" / "firepool-dashboard.json"
METRIC_NAME = re.compile(r"\bfirepool_[a-z0-9_]+")
SERIES_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
}
"""The series a family of each type writes (no ``_created``: ``broker.telemetry`` turns them
off)."""


def exported(tmp_path: Path) -> dict[str, str]:
    """Every series name a broker's registry exports (metrics on), to its family's name."""
    broker = Broker(Settings(home=tmp_path / "home", backend="fake", metrics=True))
    out = {}
    for family in broker.telemetry.registry.collect():
        for suffix in SERIES_SUFFIXES[family.type]:
            out[family.name + suffix] = family.name
    return out


def queries(node: Any) -> Iterator[str]:
    """Every PromQL text in the dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, str) and key in ("expr", "definition", "query"):
                yield value
            else:
                yield from queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from queries(item)


@pytest.fixture
def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def test_every_metric_a_panel_queries_is_exported(
    dashboard: dict[str, Any], tmp_path: Path
) -> None:
    series = exported(tmp_path)
    used = {name for text in queries(dashboard) for name in METRIC_NAME.findall(text)}
    assert used, "the dashboard queries no firepool metric"
    assert sorted(used - set(series)) == []


def test_every_exported_metric_is_on_some_panel(dashboard: dict[str, Any], tmp_path: Path) -> None:
    series = exported(tmp_path)
    used = {name for text in queries(dashboard) for name in METRIC_NAME.findall(text)}
    families = {series[name] for name in used if name in series}
    assert sorted(set(series.values()) - families) == []


def test_panels_are_well_formed(dashboard: dict[str, Any]) -> None:
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in panels:
        refs = [t["refId"] for t in panel["targets"]]
        assert panel["targets"] and len(set(refs)) == len(refs), panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
