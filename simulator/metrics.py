"""What a run measured, and the App. B.4 statistics over paired repeats.

Per run: submit -> first instruction of every job, makespan (first submission to last
completion), acquisition paths, held pod-time (pool units alive from create to gone, an
active-standby group once) and the always-on pool sized to peak concurrency over the same
window. Per arm: pooled percentiles with linear interpolation; per pair of arms: the median of
per-repeat differences and 95% bootstrap CIs over repeats (seed 2027, 2,000 resamples).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.engine import RunResult

BOOT_SEED = 2027
BOOT_N = 2000
HANDOVER_PATHS = frozenset({"standby", "new", "single_use"})
"""A handover (Table 6) is a job that found no idle pod: it waited for a standby or a new pod."""


@dataclass(slots=True)
class RunMetrics:
    makespan_s: float
    starts: list[float]
    paths: Counter[str]
    held_pod_s: float
    always_on_s: float
    handover_waits: list[float] = field(default_factory=list)
    handovers_standby: int = 0
    pods_created: int = 0
    jobs: int = 0

    @property
    def held_rel(self) -> float:
        return self.held_pod_s / self.always_on_s if self.always_on_s > 0 else float("nan")

    @property
    def start_p50(self) -> float:
        return float(np.percentile(self.starts, 50)) if self.starts else float("nan")

    @property
    def start_p90(self) -> float:
        return float(np.percentile(self.starts, 90)) if self.starts else float("nan")


def summarize(run: RunResult) -> RunMetrics:
    jobs = [j for j in run.jobs if j.finished >= 0]
    starts = [j.first - j.submitted for j in jobs]
    paths = Counter(j.path for j in jobs)
    hand = [j for j in jobs if j.path in HANDOVER_PATHS]
    window = max(0.0, run.end - run.start)
    return RunMetrics(
        makespan_s=window,
        starts=starts,
        paths=paths,
        held_pod_s=run.held_units_s,
        always_on_s=run.peak_busy * window,
        handover_waits=[j.dispatched - j.submitted for j in hand],
        handovers_standby=sum(1 for j in hand if j.path == "standby"),
        pods_created=run.pods_created,
        jobs=len(jobs),
    )


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if len(values) else float("nan")


def median(values: Sequence[float]) -> float:
    return float(np.median(values)) if len(values) else float("nan")


def bootstrap_ci(
    n: int,
    stat: Callable[[np.ndarray], np.ndarray],
    seed: int = BOOT_SEED,
    resamples: int = BOOT_N,
) -> tuple[float, float]:
    """95% percentile interval of ``stat`` over resampled repeat indices: ``stat`` gets all
    the resamples at once (a ``resamples x n`` index array) and returns one value per row."""
    if n < 2:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, n, size=(resamples, n))
    values = np.asarray(stat(draws), dtype=float)
    lo, hi = np.nanpercentile(values, [2.5, 97.5])
    return (float(lo), float(hi))


def arm_summary(runs: Sequence[RunMetrics]) -> dict[str, object]:
    starts = [s for r in runs for s in r.starts]
    paths: Counter[str] = Counter()
    for r in runs:
        paths.update(r.paths)
    waits = [w for r in runs for w in r.handover_waits]
    handovers = len(waits)
    out: dict[str, object] = {
        "repeats": len(runs),
        "jobs": sum(r.jobs for r in runs),
        "makespan_median_s": median([r.makespan_s for r in runs]),
        "start_p50_s": pct(starts, 50),
        "start_p90_s": pct(starts, 90),
        "paths": dict(sorted(paths.items())),
        "held_pod_s": median([r.held_pod_s for r in runs]),
        "held_vs_always_on": median([r.held_rel for r in runs]),
        "pods_created_per_repeat": median([r.pods_created for r in runs]),
        "handovers": handovers,
        "handover_wait_median_s": median(waits),
        "handovers_by_standby_frac": (
            sum(r.handovers_standby for r in runs) / handovers if handovers else float("nan")
        ),
    }
    return out


def paired(ref: Sequence[RunMetrics], other: Sequence[RunMetrics]) -> dict[str, object]:
    """``other`` against ``ref`` (the first arm), repeat by repeat."""
    a = np.array([r.makespan_s for r in ref])
    b = np.array([r.makespan_s for r in other])
    p_a = np.array([r.start_p50 for r in ref])
    p_b = np.array([r.start_p50 for r in other])
    n = min(len(a), len(b))
    a, b, p_a, p_b = a[:n], b[:n], p_a[:n], p_b[:n]
    speedup = float(np.median(b) / np.median(a)) if n else float("nan")
    return {
        "speedup": speedup,
        "speedup_ci95": bootstrap_ci(
            n, lambda i: np.median(b[i], axis=1) / np.median(a[i], axis=1)
        ),
        "makespan_diff_median_s": float(np.median(b - a)) if n else float("nan"),
        "makespan_diff_ci95": bootstrap_ci(n, lambda i: np.median(b[i] - a[i], axis=1)),
        "start_p50_diff_median_s": float(np.median(p_b - p_a)) if n else float("nan"),
        "start_p50_diff_ci95": bootstrap_ci(n, lambda i: np.median(p_b[i] - p_a[i], axis=1)),
    }
