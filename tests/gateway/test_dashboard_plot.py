"""The dashboard's server-drawn charts and its pool rows, as pure functions."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.dashboard_views import WARM_ACQUISITION, StartStats, percentile, pool_rows
from broker.jobs import Job
from broker.store.codec import job_row
from gateway.dashboard.plot import HEIGHT, WIDTH, chart

values = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6))


@given(st.lists(st.tuples(st.floats(min_value=0, max_value=3600), values), max_size=50))
def test_every_point_of_a_chart_lies_in_its_box_and_a_missing_value_breaks_the_line(
    points: list[tuple[float, float | None]],
) -> None:
    drawn = chart(points, 0.0, 3600.0)
    shown = [v for _, v in points if v is not None]
    assert len(drawn.dots) == len(shown)
    for x, y in drawn.dots:
        assert 0 <= x <= WIDTH and 0 <= y <= HEIGHT
    runs = 0
    previous = None
    for _, value in points:
        if value is not None and previous is None:
            runs += 1
        previous = value
    assert len(drawn.lines) == runs
    assert drawn.last == (shown[-1] if shown else None)


def test_percentiles_are_nearest_rank_and_none_without_values() -> None:
    assert percentile([], 0.5) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.9) == 4.0
    stats = StartStats(acquired=4, warm=1, starts=(0.1, 0.2))
    assert stats.warm_hit_rate == 0.25 and stats.p50_s == 0.2
    assert StartStats().warm_hit_rate is None


def test_a_pool_row_sorts_the_reports_pods_by_state_and_role() -> None:
    report = {
        "pools": {
            "h200": {
                "accelerator": "h200",
                "pods": {
                    "IDLE:active": 2,
                    "RUNNING:active": 1,
                    "ASSIGNED:active": 1,
                    "STARTING:active": 3,
                    "IDLE:standby": 4,
                    "RESETTING:active": 1,
                },
                "held": 1,
                "queued": 5,
                "failing": None,
            }
        },
        "budgets": {"h200": {"used": 7, "budget": 8, "held_unit_seconds": 12.5}},
    }
    [row] = pool_rows(report, {})
    assert (row.warm, row.held, row.standby, row.starting, row.running, row.queued) == (
        2, 1, 4, 3, 2, 5,
    )  # fmt: skip
    assert (row.budget_used, row.budget, row.held_unit_seconds) == (7, 8, 12.5)
    assert row.stats == StartStats()


def test_the_store_writes_a_warm_acquisition_as_the_warm_hit_count_matches_it() -> None:
    def acquisition(path: str) -> str:
        job = Job("j", "f", 1, "c", "cpu", None, acquisition={"path": path, "reason": None})
        text: str = job_row(job)["acquisition"]
        return text

    prefix = WARM_ACQUISITION.removesuffix("%")
    assert acquisition("warm").startswith(prefix)
    for other in ("recycled", "idle", "standby", "new", "single_use", "warmer"):
        assert not acquisition(other).startswith(prefix)
