"""``benchmarks.loops`` summarises real-broker repeats with the simulator's statistics."""

from __future__ import annotations

from benchmarks.loops import peak_concurrency, summarize


def _runs(makespans: tuple[float, ...], path: str) -> list[dict[str, object]]:
    return [{"makespan_s": m, "starts": [0.1], "paths": {path: 1}, "failed": 0,
             "held_pod_s": 2 * m, "held_vs_always_on": 0.5} for m in makespans]  # fmt: skip


def test_the_paired_makespan_difference_has_a_real_bootstrap_interval() -> None:
    runs = {
        "reuse-on": _runs((7.7, 8.0, 7.0, 6.8, 6.6), "warm"),
        "reuse-off": _runs((10.6, 10.8, 9.4, 9.0, 9.1), "new"),
    }
    off = summarize(runs, ["reuse-on", "reuse-off"])["arms"]["reuse-off"]
    lo, hi = off["makespan_diff_ci95"]
    assert lo < off["makespan_diff_median_s"] < hi  # once a degenerate [x, x]: one median
    assert off["speedup_vs_reuse-on"] > 1.3 and off["paths"] == {"new": 5}
    assert off["held_pod_s"] == 2 * 9.4 and off["held_vs_always_on"] == 0.5


def test_peak_concurrency_counts_overlaps_and_closes_an_end_before_a_start() -> None:
    assert peak_concurrency([]) == 0
    assert peak_concurrency([(0, 2), (1, 3), (2, 4)]) == 2  # (0, 2) ends as (2, 4) starts
    assert peak_concurrency([(0, 10), (1, 2), (3, 4), (1.5, 3.5)]) == 3
