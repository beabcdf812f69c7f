"""The acceptance rows: the sensitivity study (``--report``: "Sensitivity to one constant")
and the scorecard of every per-arm metric against B.4's bands."""

from __future__ import annotations

from typing import Any

import pytest

from simulator import acceptance
from simulator.report import _sensitivity


def test_sensitivity_runs_each_value_cold_and_carried_over() -> None:
    rows = acceptance.sensitivity("h200-agent-off", "job_overhead", ("0", "3"), repeats=2)
    assert [(r["carry_over"], r["value"]) for r in rows] == [
        (False, "0"), (False, "3"), (True, "0"), (True, "3"),
    ]  # fmt: skip
    for r in rows:
        assert list(r["makespans_s"]) == ["reuse-on", "reuse-off"]
        assert r["speedup"] == r["makespans_s"]["reuse-off"] / r["makespans_s"]["reuse-on"]
    # The setting reaches the venue: 3 s more per job lengthens the Reuse On loop.
    assert rows[1]["makespans_s"]["reuse-on"] > rows[0]["makespans_s"]["reuse-on"] + 10
    # Carried over, Reuse On starts on the pods the run before it left.
    assert rows[2]["new_pods"]["reuse-on"] < rows[0]["new_pods"]["reuse-on"]
    table = _sensitivity(rows)
    assert table.count("| h200-agent-off | job_overhead=") == 4


def test_every_sensitivity_entry_names_a_row_and_a_setting_the_venue_has() -> None:
    keys = {row.key for row in acceptance.ROWS}
    for key, setting, values in acceptance.SENSITIVITY:
        assert key in keys and values
        rows = acceptance.sensitivity(key, setting, values[:1], repeats=1)
        assert len(rows) == 2


def test_a_row_reports_its_verdict_cold_and_its_speedup_carried_over() -> None:
    row = next(r for r in acceptance.ROWS if r.key == "h200-rl-fresh")
    out = acceptance.run_row(row, repeats=2, compare_retire=False)
    assert out["speedup"] == out["result"]["arms"]["fresh"]["vs_reuse-on"]["speedup"]
    lo, hi = out["speedup_carry_over_ci95"]
    assert lo <= out["speedup_carry_over"] <= hi
    # Carried over, Reuse On after a fresh run waits for its single-use pods to go first,
    # and the fresh arm after a reuse run waits for the held pods: not the cold figure.
    assert out["speedup_carry_over"] != out["speedup"]


def _rows(scale: dict[str, float], on_faster: bool = True) -> list[dict[str, Any]]:
    """Campaign results shaped as ``run_row``'s, each metric the paper's times
    ``scale[metric]``."""
    rows = []
    for row in acceptance.ROWS:
        ref, other = row.arms.split(",")
        arms: dict[str, dict[str, Any]] = {ref: {}, other: {}}
        for m in acceptance.PAPER_METRICS:
            if m.row == row.key:
                arms[m.arm][m.metric] = m.paper * scale[m.metric]
        for arm, makespan in ((ref, 100.0), (other, 300.0)):
            arms[arm].setdefault("makespan_median_s", makespan)
        if not on_faster:
            arms[ref]["makespan_median_s"] = 2 * arms[other]["makespan_median_s"]
        arms[other]["vs_" + ref] = {"start_p50_diff_median_s": 1.0 if on_faster else -1.0}
        rows.append({"key": row.key, "result": {"arms": arms}})
    return rows


def test_the_scorecard_judges_each_metric_in_its_own_band() -> None:
    exact = acceptance.scorecard(_rows(dict.fromkeys(_METRICS, 1.0)))
    fitted = [m for m in exact["metrics"] if m["fitted"]]
    assert [(m["row"], m["metric"]) for m in fitted] == [("h200-rl-fresh", "makespan_median_s")] * 2
    assert exact["held_out"] == len(acceptance.PAPER_METRICS) - 2
    assert exact["held_out_within_band"] == exact["held_out"]
    assert all(c["ranking_kept"] and c["sign_kept"] is not False for c in exact["checks"])

    # x1.40 is inside the queue-median band (x0.69-1.44), outside the makespan band (x1.31).
    wide = acceptance.scorecard(_rows(dict.fromkeys(_METRICS, 1.40)))
    for m in wide["metrics"]:
        assert m["ratio"] == pytest.approx(1.40)
        assert m["within_band"] is (m["metric"] != "makespan_median_s")
    makespans = sum(m["metric"] == "makespan_median_s" and not m["fitted"] for m in wide["metrics"])
    assert wide["held_out_within_band"] == wide["held_out"] - makespans


def test_the_scorecard_flags_a_reversed_ranking_and_a_wrong_sign() -> None:
    card = acceptance.scorecard(_rows(dict.fromkeys(_METRICS, 1.0), on_faster=False))
    assert not any(c["ranking_kept"] for c in card["checks"])
    signs = {c["row"]: c["sign_kept"] for c in card["checks"]}
    assert signs.pop("h200-standby") is None  # Table 6 gives no paired start-p50 difference
    assert set(signs.values()) == {False}


def test_every_paper_metric_names_a_row_arm_and_summary_key() -> None:
    row = next(r for r in acceptance.ROWS if r.key == "h200-standby")
    summary = acceptance.run_row(row, repeats=1, compare_retire=False)["result"]["arms"]
    for m in acceptance.PAPER_METRICS:
        arms = next(r.arms for r in acceptance.ROWS if r.key == m.row).split(",")
        assert m.arm in arms and m.paper > 0
        assert m.metric in summary["standby-on"]


_METRICS = ("start_p50_s", "makespan_median_s", "handover_wait_median_s")
