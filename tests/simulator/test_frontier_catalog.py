"""``benchmarks.frontier`` gives the broker exactly the simulator's catalog for an arm, and
summarises held capacity the simulator's way."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml

from benchmarks.frontier import catalog_yaml, summarize
from pool_manager.catalog import Catalog
from simulator.arms import build_catalog, parse_arm
from simulator.venue import load_venue


@pytest.mark.parametrize("arm", ["ka3", "f1-c2-ka3", "ka45", "reuse-on"])
def test_the_brokers_catalog_is_the_simulators(arm: str) -> None:
    catalog = build_catalog(load_venue("local"), parse_arm(arm))
    assert Catalog.from_mapping(yaml.safe_load(catalog_yaml(catalog))) == catalog


def test_held_capacity_is_the_median_of_each_runs_ratio() -> None:
    def run(held: float, always_on: float, starts: list[float]) -> dict[str, object]:
        return {"held_pod_s": held, "always_on_s": always_on, "starts": starts, "jobs": 2,
                "failed": 0, "paths": Counter({"warm": 2}), "drained": True}  # fmt: skip

    out = summarize({"ka3": [run(5.0, 10.0, [0.1, 0.3]), run(9.0, 10.0, [0.2, 0.2]),
                             run(6.0, 10.0, [0.1, 0.1])]})["ka3"]  # fmt: skip
    assert out["held_vs_always_on"] == 0.6 and out["held_pod_s"] == 6.0
    assert out["start_p50_s"] == 0.2 and out["jobs"] == 6 and out["all_drained"]
    assert out["paths"] == {"warm": 6}
