"""The acceptance rows' sensitivity study (``--report``: "Sensitivity of the rows outside
the band")."""

from __future__ import annotations

from pool_manager.simulator import acceptance
from pool_manager.simulator.report import _sensitivity


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
