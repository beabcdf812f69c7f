"""Carry-over between arms with different pool settings: a broker restart on the new catalog."""

from __future__ import annotations

import pytest

from pool_manager.model import PodState
from simulator.arms import arm_names, parse_arm
from simulator.engine import Simulation
from simulator.experiment import Workload, run_arms
from simulator.venue import load_venue


def _pod_fields(sim: Simulation) -> list[tuple[object, ...]]:
    return sorted(
        (p.name, p.state, p.role, p.gpu, p.owner, p.tag, p.hold_until) for p in sim.tracker.pods()
    )


def test_the_next_arm_starts_on_every_pod_the_last_one_left_under_its_own_settings() -> None:
    venue = load_venue("h200")
    sim = Simulation(venue, parse_arm("reuse-on"), seed=3)
    sim.warm_up(Workload("w-agent", agents=2).programs(3))
    before = _pod_fields(sim)
    used = sim.ledger.used(venue.pool.accelerator)
    assert any(state is PodState.IDLE and owner for _, state, _, _, owner, _, _ in before)
    assert any(role == "standby" for _, _, role, _, _, _, _ in before)

    sim.reconfigure(parse_arm("fresh"))

    assert sim.arm.name == "fresh"
    assert sim.catalog.pools[venue.sku].standbys_per_active == 0
    assert _pod_fields(sim) == before  # owners, tags and holds survive the restart
    assert sim.ledger.used(venue.pool.accelerator) == used
    assert all(sim.tracker.gpu_verified(card) for card in sim.pod_card.values())
    for caller, program in Workload("w-agent", agents=2).programs(4):
        sim.add(caller, program)
    result = sim.run()
    assert result.jobs and {job.path for job in result.jobs} == {"single_use"}
    # a used pod is never clean enough for a single-use job, carried over or not
    used = {name for name, _, _, _, owner, _, _ in before if owner is not None}
    assert used and not {name for job in result.jobs for name in job.pods} & used


def test_carry_over_runs_arms_with_different_settings_and_costs_the_fresh_arm_its_start() -> None:
    venue = load_venue("h200")
    arms = arm_names("reuse-on,fresh")
    empty = run_arms(venue, Workload("w-agent", agents=2), arms, 2, seed=5)[0]
    carried = run_arms(venue, Workload("w-agent", agents=2, carry_over=True), arms, 2, seed=5)[0]
    # After a reuse run the cap is full of held pods: the first fresh job waits for a
    # hold to break and its pod to terminate, longer than from an empty pool.
    first_wait = [r.starts[0] for r in empty[1].runs], [r.starts[0] for r in carried[1].runs]
    assert max(first_wait[1]) > max(first_wait[0])


def test_a_pool_missing_from_the_next_arms_catalog_is_an_error() -> None:
    sim = Simulation(load_venue("prod-cpu"), parse_arm("shared"), seed=1)
    sim.warm_up(Workload("w-agent", agents=1).programs(1))
    with pytest.raises(ValueError, match="has no pool"):
        sim.reconfigure(parse_arm("per-env"))
