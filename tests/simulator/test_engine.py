"""The simulator drives the broker's own control plane, deterministically per seed."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

import simulator.engine as engine
from simulator.arms import arm_names, parse_arm
from simulator.cli import main
from simulator.experiment import Workload, report, run_arms, run_once
from simulator.venue import (
    load_venue,
    venue_from_mapping,
    venue_names,
    with_settings,
)
from tests.simulator.fresh import in_a_fresh_process


def _run(venue: str, workload: Workload, arms: str, repeats: int = 2) -> dict[str, Any]:
    v = load_venue(venue)
    results, jobs, wall = run_arms(v, workload, arm_names(arms), repeats, seed=7)
    out = report(v, workload, results, jobs, wall)
    out.pop("wall_s")
    out.pop("simulated_jobs_per_s")
    return out


def test_a_small_simulation_is_deterministic_for_a_seed() -> None:
    wl = Workload("w-agent", agents=2)
    first = _run("h200", wl, "reuse-on,reuse-off,fresh")
    second = _run("h200", wl, "reuse-on,reuse-off,fresh")
    assert json.dumps(first, sort_keys=True) == json.dumps(second, sort_keys=True)


def test_every_dispatch_goes_through_the_shared_dispatcher_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    real = engine.dispatch_pass

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "dispatch_pass", counting)
    metrics, jobs = run_once(load_venue("prod-cpu"), parse_arm("reuse-on"), Workload("w-rl"), 1)
    assert jobs == 44 and metrics.jobs == 44
    assert calls and calls == sorted(calls)  # virtual time only moves forward


def test_arms_differ_only_in_how_pods_are_acquired() -> None:
    cpu = load_venue("prod-cpu")
    on, _ = run_once(cpu, parse_arm("reuse-on"), Workload("w-agent", agents=2), 3)
    off, _ = run_once(cpu, parse_arm("reuse-off"), Workload("w-agent", agents=2), 3)
    fresh, _ = run_once(cpu, parse_arm("fresh"), Workload("w-agent", agents=2), 3)
    assert on.jobs == off.jobs == fresh.jobs
    assert on.paths["warm"] > 0 and "recycled" not in on.paths
    assert off.paths["recycled"] > 0 and "warm" not in off.paths
    assert set(fresh.paths) == {"single_use"}
    assert on.makespan_s < off.makespan_s < fresh.makespan_s


def test_standbys_take_over_across_reuse_boundaries_on_h200() -> None:
    h200 = load_venue("h200")
    on, _ = run_once(h200, parse_arm("standby-on"), Workload("standby", jobs=12), 2)
    off, _ = run_once(h200, parse_arm("standby-off"), Workload("standby", jobs=12), 2)
    assert on.handovers_standby > 0 and off.handovers_standby == 0
    assert on.makespan_s < off.makespan_s


def test_a_promotion_cost_is_queue_wait_on_standby_handovers_only() -> None:
    h200 = load_venue("h200")
    slow = with_settings(h200, ["promotion=0.81"])
    wl = Workload("standby", jobs=12)
    on, _ = run_once(h200, parse_arm("standby-on"), wl, 2)
    promoted, _ = run_once(slow, parse_arm("standby-on"), wl, 2)
    assert promoted.handovers_standby > 0
    # A handover waits for a promotion or for a new pod (~20 s): each now waits 0.81 s more.
    assert min(promoted.handover_waits) >= 0.81 > min(on.handover_waits)
    assert promoted.makespan_s > on.makespan_s
    # Without standbys nothing is promoted: the same run, draw for draw.
    off, _ = run_once(h200, parse_arm("standby-off"), wl, 2)
    assert run_once(slow, parse_arm("standby-off"), wl, 2)[0] == off


def test_the_gpu_cap_is_never_exceeded() -> None:
    h200 = load_venue("h200")
    sim = engine.Simulation(h200, parse_arm("reuse-off"), 5)
    peak = 0
    real = sim._create

    def create(action: Any, joining: int = 0) -> None:
        nonlocal peak
        real(action, joining)
        peak = max(peak, sum(1 for n in sim.card_pods.values() if n))

    sim._create = create  # type: ignore[method-assign]
    for caller, program in Workload("w-agent", agents=4).programs(5):
        sim.add(caller, program)
    sim.run()
    assert 0 < peak <= h200.budget


@pytest.mark.parametrize("arm", ["reuse-on", "reuse-off", "fresh"])
def test_held_pod_time_is_each_pods_life_from_create_to_gone(arm: str) -> None:
    """The run's held time (the ledger's integral on the virtual clock) against pod lives
    summed one by one, on a CPU venue where every pod holds one unit from its create (its
    reservation, the same instant) until it is gone, or until the run ends."""
    venue = load_venue("prod-cpu")
    sim = engine.Simulation(venue, parse_arm(arm), 3)
    born: dict[str, float] = {}
    lives: list[float] = []
    real_create, real_gone = sim._create, sim._gone

    def create(action: Any, joining: int = 0) -> None:
        before = {p.name for p in sim.tracker.pods()}
        real_create(action, joining)
        for pod in sim.tracker.pods():
            if pod.name not in before and pod.name not in born:
                born[pod.name] = sim.now

    def gone(name: str) -> None:
        real_gone(name)
        lives.append(sim.now - born.pop(name))

    sim._create = create  # type: ignore[method-assign]
    sim._gone = gone  # type: ignore[method-assign]
    for caller, program in Workload("w-agent", agents=4).programs(3):
        sim.add(caller, program)
    result = sim.run()
    alive = sum(sim.now - t for t in born.values())
    assert result.held_units_s > 100.0
    assert result.held_units_s == pytest.approx(sum(lives) + alive, rel=1e-9)


def test_shipped_venues_load_and_unknown_keys_are_rejected() -> None:
    assert {"local", "prod-cpu", "h200"} <= set(venue_names())
    assert load_venue("h200").pool.standbys_per_active == 3
    assert load_venue("prod-cpu").pool.max_count == 16
    with pytest.raises(ValueError, match="colour"):
        venue_from_mapping({"name": "x", "budget": 1, "pool": {"sku": "x"},
                            "start_phases": {}, "colour": 1})  # fmt: skip
    with pytest.raises(ValueError, match="unknown arm"):
        parse_arm("reuse-sometimes")


def test_cli_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--venue", "h200", "--workload", "standby", "--jobs", "8",
               "--arms", "standby-on,standby-off", "--repeats", "2", "--json"])  # fmt: skip
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    arm = out["arms"]["standby-on"]
    for key in ("makespan_median_s", "start_p50_s", "start_p90_s", "paths", "held_pod_s",
                "handover_wait_median_s", "handovers_by_standby_frac"):  # fmt: skip
        assert key in arm
    assert out["simulated_jobs_per_s"] > 0
    assert main(["--arms", "nope", "--repeats", "1"]) == 2


def _plans(monkeypatch: pytest.MonkeyPatch, venue: str, mode: str) -> list[tuple[float, bool]]:
    """``(now, planned)`` of every pass of one W-RL Reuse Off run in ``mode``: a pass plans
    when the shell asks (``reconcile``) or a new job was left waiting (``replan_waiting``)."""
    calls: list[tuple[float, bool]] = []
    real = engine.dispatch_pass

    def recording(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        planned = args[3] or (kwargs["replan_waiting"] and bool(result.waiting))
        calls.append((args[2], planned))
        return result

    monkeypatch.setattr(engine, "dispatch_pass", recording)
    v = load_venue(venue).with_(dispatch_mode=mode)
    run_once(v, parse_arm("reuse-off"), Workload("w-rl"), 1)
    return calls


def test_the_event_dispatcher_plans_on_change_not_on_every_waiting_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = _plans(monkeypatch, "prod-cpu", "event")
    assert any(not reconcile for _, reconcile in calls)  # waiting passes that do not plan
    assert any(reconcile for _, reconcile in calls)


def test_the_tick_dispatcher_scales_only_on_its_reconcile_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    v = load_venue("prod-cpu")
    plans = [now for now, reconcile in _plans(monkeypatch, "prod-cpu", "tick") if reconcile]
    assert len(plans) > 2
    gaps = [b - a for a, b in itertools.pairwise(plans)]
    # a reconcile runs on the first tick at or after the interval: never sooner
    assert min(gaps) >= v.reconcile_s - 1e-9
    assert max(gaps) <= v.reconcile_s + v.tick_s + 1e-9


def test_carry_over_starts_each_run_on_the_pool_the_run_before_it_left() -> None:
    wl = Workload("w-agent", agents=2)
    carried = Workload("w-agent", agents=2, carry_over=True)
    cold = _run("h200", wl, "reuse-on,reuse-off")["arms"]
    warm = _run("h200", carried, "reuse-on,reuse-off")["arms"]
    assert cold["reuse-on"]["paths"].get("new", 0) >= 2  # an empty pool: a start per agent
    assert warm["reuse-on"]["paths"].get("new", 0) < cold["reuse-on"]["paths"]["new"]
    assert "warm" not in warm["reuse-off"]["paths"]  # fresh tags never repeat across runs
    with pytest.raises(ValueError, match="the same pools"):
        run_arms(load_venue("h200"), carried, arm_names("shared,per-env"), 1)


def test_runs_in_worker_processes_give_the_same_results() -> None:
    out = in_a_fresh_process("""
        import json
        from simulator.arms import arm_names
        from simulator.experiment import Workload, report, run_arms
        from simulator.venue import load_venue

        v, wl, arms = load_venue("prod-cpu"), Workload("w-rl"), arm_names("reuse-on,reuse-off")
        serial = report(v, wl, *run_arms(v, wl, arms, 3, seed=5))
        forked = report(v, wl, *run_arms(v, wl, arms, 3, seed=5, workers=2))
        for out in (serial, forked):
            out.pop("wall_s")
            out.pop("simulated_jobs_per_s")
        print(json.dumps(serial, sort_keys=True) == json.dumps(forked, sort_keys=True))
    """)
    assert out.split() == ["True"]
