"""The paper's headline loop speedups (Table 5, Table 6) as simulated campaigns.

Each row names the venue, the dispatcher the paper's campaign ran (the fresh-pod columns ran
the event-driven dispatcher, the Reuse Off columns an earlier tick-driven one, Table 5's
caption), the workload, the two arms and the paper's measured speedup. A row passes when the
simulated speedup is inside the paper's own prediction band for makespans (B.4: x0.76-1.31 of
the measured value). ``CALIBRATION`` says which rows fitted venue constants and which were
held out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pool_manager.simulator.arms import arm_names
from pool_manager.simulator.experiment import Workload, report, run_arms, with_dispatch
from pool_manager.simulator.venue import Venue, load_venue

BAND = (0.76, 1.31)


@dataclass(frozen=True, slots=True)
class Row:
    key: str
    title: str
    venue: str
    dispatch: str
    workload: Workload
    arms: str
    paper: float
    role: str
    """``calibrate``: venue constants were fitted on it; ``validate``: held out."""


ROWS: tuple[Row, ...] = (
    Row("h200-agent-fresh", "H200 W-Agent (4 agents) vs fresh pod per job", "h200", "event",
        Workload("w-agent", agents=4), "reuse-on,fresh", 13.0, "validate"),
    Row("h200-rl-fresh", "H200 W-RL vs fresh pod per job", "h200", "event",
        Workload("w-rl"), "reuse-on,fresh", 10.8, "calibrate"),
    Row("h200-agent-off", "H200 W-Agent (2 agents) vs Reuse Off", "h200", "tick",
        Workload("w-agent", agents=2), "reuse-on,reuse-off", 3.6, "validate"),
    Row("cpu-rl-off", "CPU W-RL vs Reuse Off", "prod-cpu", "tick",
        Workload("w-rl"), "reuse-on,reuse-off", 4.5, "validate"),
    Row("cpu-agent-off", "CPU W-Agent (4 agents) vs Reuse Off", "prod-cpu", "tick",
        Workload("w-agent", agents=4), "reuse-on,reuse-off", 2.2, "validate"),
    Row("h200-standby", "Standby benchmark (30 sequential jobs, fresh tag each)", "h200",
        "event", Workload("standby"), "standby-on,standby-off", 3.0,
        "validate"),
)  # fmt: skip


def run_row(row: Row, repeats: int, seed: int = 1, venue: Venue | None = None) -> dict[str, Any]:
    v = with_dispatch(venue or load_venue(row.venue), row.dispatch)
    arms = arm_names(row.arms)
    results, jobs, wall = run_arms(v, row.workload, arms, repeats, seed)
    out = report(v, row.workload, results, jobs, wall)
    ref, other = arms[0].name, arms[1].name
    summary = out["arms"]
    eff = summary[other]["vs_" + ref]
    lo, hi = BAND[0] * row.paper, BAND[1] * row.paper
    speedup = float(eff["speedup"])
    ok = lo <= speedup <= hi
    if row.key == "h200-standby":
        frac = summary[ref]["handovers_by_standby_frac"]
        ok = ok and frac is not None and frac >= 0.8
    return {
        "key": row.key, "title": row.title, "role": row.role, "paper": row.paper,
        "band": [lo, hi], "speedup": speedup, "speedup_ci95": eff["speedup_ci95"],
        "within_band": ok, "result": out,
    }  # fmt: skip


def run_all(repeats: int, seed: int = 1) -> list[dict[str, Any]]:
    return [run_row(row, repeats, seed) for row in ROWS]
