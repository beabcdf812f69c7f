"""The sweeps behind C.1 / Figures 5-7 keep the paper's shapes on tiny inputs."""

from __future__ import annotations

from simulator import studies
from simulator.arms import build_catalog, parse_arm
from simulator.experiment import Workload, run_once
from simulator.venue import load_venue


def test_a_long_keep_alive_holds_more_than_a_short_one() -> None:
    rows = studies.frontier(arms=("ka15", "ka900"), patterns=("bursty",), seeds=1,
                            rate=0.05, duration_s=900.0)  # fmt: skip
    held = {r["arm"]: r["held_rel"] for r in rows}
    assert held["ka900"] > held["ka15"] > 0


def test_crossover_is_where_the_speedup_first_drops_below_the_level() -> None:
    rows = [{"workload": "w-rl", "think_s": 0, "body_s": b, "speedup": s}
            for b, s in ((1, 3.0), (10, 1.5), (100, 1.0))]  # fmt: skip
    x = studies.crossover(rows, "w-rl")
    assert x is not None and 10 < x < 100
    assert studies.crossover(rows, "w-agent") is None


def test_a_pool_per_environment_has_its_own_pool_and_the_split_budget() -> None:
    v = studies.quiet_cpu(64)
    assert len(build_catalog(v, parse_arm("shared"), 8).pools) == 1
    per_env = build_catalog(v, parse_arm("per-env"), 8)
    split = build_catalog(v, parse_arm("per-env-split"), 8)
    assert len(per_env.pools) == 8 and {p.max_count for p in per_env.pools.values()} == {64}
    assert {p.max_count for p in split.pools.values()} == {8}
    assert per_env.budgets == {"cpu": 64}


def test_scale_shrinks_bodies_and_pauses_alike() -> None:
    v = load_venue("local")
    full, _ = run_once(v, parse_arm("reuse-on"), Workload("w-agent", agents=1), 3)
    quarter, _ = run_once(v, parse_arm("reuse-on"), Workload("w-agent", agents=1, scale=0.25), 3)
    assert quarter.jobs == full.jobs
    assert quarter.makespan_s < full.makespan_s * 0.5


def test_one_shared_pool_stays_flat_while_pools_per_environment_grow() -> None:
    rows = studies.fragmentation(envs=(1, 16), seeds=1, duration_s=1200.0)
    assert rows == studies.fragmentation(envs=(1, 16), seeds=1, duration_s=1200.0, workers=2)
    held = {(r["workload"], r["envs"], r["arm"]): r["held_rel"] for r in rows}
    for kind in ("rl-sessions", "sessions"):
        shared_1, shared_16 = held[(kind, 1, "shared")], held[(kind, 16, "shared")]
        assert shared_16 < 1.2 * shared_1  # flat: late binding shares pods across envs
        assert held[(kind, 16, "per-env")] > 1.5 * shared_16


def test_pools_on_a_tight_shared_budget_all_finish() -> None:
    """Eight per-environment pools on H200's two GPUs: once a pool's standby groups are past
    their keep-alive, its idle cap no longer keeps them from the pools waiting on the budget
    (before the budget reclaim this run was stuck at t = 10⁶ s)."""
    workload = Workload("rl-sessions", envs=8, duration_s=600)
    for arm in ("per-env", "per-env-split"):
        metrics, jobs = run_once(load_venue("h200"), parse_arm(arm), workload, 1)
        assert jobs == 660 and metrics.makespan_s < 10_000
