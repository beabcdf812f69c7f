"""Standby groups, the per-GPU gate and exclusivity (paper §6, App. A.4)."""

from __future__ import annotations

from pool_manager.budgets import BudgetLedger
from pool_manager.model import PodInfo
from pool_manager.states import PodState
from pool_manager.tracker import Tracker
from tests.pool_manager.builders import (
    add_ready,
    lease,
    make_catalog,
    make_pod,
    make_request,
    make_spec,
    make_tracker,
    miss,
    state_of,
)


def gpu_tracker(budget: int | None = None) -> Tracker:
    spec = make_spec("gpu", standbys_per_active=3)
    budgets = {} if budget is None else {"h200": budget}
    return make_tracker(spec, budgets=budgets)


def group(t: Tracker, gpu: str = "G0", standbys: int = 1, verified: bool = True) -> None:
    add_ready(t, "active", sku="gpu", gpu=gpu)
    for i in range(standbys):
        add_ready(t, f"standby{i}", sku="gpu", gpu=gpu, role="standby")
    if verified:
        t.mark_gpu_verified(gpu, True, 0.0)


def test_one_pod_per_physical_gpu_runs_a_job() -> None:
    t = gpu_tracker()
    group(t)
    first = lease(t, make_request("alice", sku="gpu"))
    t.launched(first.job_id, 1.0)
    assert miss(t, make_request("bob", sku="gpu")).reason == "no_idle_pod"


def test_the_gate_opens_only_after_a_verified_dead_reset() -> None:
    t = gpu_tracker()
    group(t)
    first = lease(t, make_request("alice", sku="gpu"))
    t.launched(first.job_id, 1.0)
    t.release(first.job_id, True, 2.0)
    assert lease(t, make_request("bob", sku="gpu"), now=3.0).path == "standby"


def test_an_unclean_reset_keeps_the_gate_closed_until_the_pod_is_gone() -> None:
    t = gpu_tracker()
    group(t)
    first = lease(t, make_request("alice", sku="gpu"))
    t.launched(first.job_id, 1.0)
    [rel] = t.release(first.job_id, False, 2.0)
    assert rel.retire
    miss(t, make_request("bob", sku="gpu"), now=3.0)
    t.pod_gone("active", 4.0)
    assert lease(t, make_request("bob", sku="gpu"), now=5.0).path == "standby"


def test_a_held_pod_is_parked_while_a_promoted_standby_runs() -> None:
    t = gpu_tracker()
    group(t)
    first = lease(t, make_request("alice", sku="gpu"))
    t.release(first.job_id, True, 2.0)
    promoted = lease(t, make_request("bob", sku="gpu"), now=3.0)
    assert miss(t, make_request("alice", sku="gpu"), now=4.0).reason == "no_idle_pod"
    t.release(promoted.job_id, True, 5.0)
    assert lease(t, make_request("alice", sku="gpu"), now=6.0).path == "warm"


def test_a_standby_is_not_promoted_while_an_idle_pod_is_available() -> None:
    t = gpu_tracker()
    group(t)
    add_ready(t, "other", sku="gpu", gpu="G1")
    got = lease(t, make_request("alice", sku="gpu"))
    assert got.path == "idle"


def test_promotion_fails_closed_until_a_sweep_verifies_the_gpu() -> None:
    t = gpu_tracker()
    group(t, verified=False)
    first = lease(t, make_request("alice", sku="gpu"))
    t.release(first.job_id, True, 2.0)
    miss(t, make_request("bob", sku="gpu"), now=3.0)
    t.mark_gpu_verified("G0", True, 4.0)
    assert lease(t, make_request("bob", sku="gpu"), now=5.0).path == "standby"


def test_a_non_exclusive_gpu_disables_promotion() -> None:
    t = gpu_tracker()
    group(t)
    t.mark_gpu_verified("G0", False, 1.0)
    first = lease(t, make_request("alice", sku="gpu"))
    t.release(first.job_id, True, 2.0)
    miss(t, make_request("bob", sku="gpu"), now=3.0)


def test_after_a_restart_every_gpu_is_unverified() -> None:
    t = gpu_tracker()
    group(t)
    first = lease(t, make_request("alice", sku="gpu"))
    t.launched(first.job_id, 1.0)
    t.release(first.job_id, True, 2.0)
    fresh = Tracker(t.catalog)
    fresh.restore(t.pods(), 3.0)
    assert not fresh.gpu_verified("G0")
    miss(fresh, make_request("bob", sku="gpu"), now=4.0)
    assert lease(fresh, make_request("alice", sku="gpu"), now=4.0).path == "warm"


def test_unclaiming_a_promoted_standby_makes_it_a_standby_again() -> None:
    t = gpu_tracker()
    group(t)
    first = lease(t, make_request("alice", sku="gpu"))
    t.release(first.job_id, True, 2.0)
    promoted = lease(t, make_request("bob", sku="gpu"), now=3.0)
    t.unclaim(promoted.job_id, 3.0)
    pod = t.get("standby0")
    assert pod is not None and (pod.role, pod.state) == ("standby", PodState.IDLE)
    assert lease(t, make_request("alice", sku="gpu"), now=4.0).path == "warm"


def test_the_group_counts_once_in_the_budget() -> None:
    ledger = BudgetLedger({"h200": 1})
    t = Tracker(make_catalog(make_spec("gpu", standbys_per_active=3)), ledger)
    assert ledger.reserve("h200", 1)  # what the scaler does before the create
    t.add_pod(make_pod("active", "gpu", gpu="G0"), 0.0)
    for i in range(3):
        t.add_pod(make_pod(f"s{i}", "gpu", gpu="G0", role="standby"), 0.0)
    assert ledger.used("h200") == 1
    for name in ("s0", "active", "s1"):
        t.pod_gone(name, 1.0)
    assert ledger.used("h200") == 1
    t.pod_gone("s2", 1.0)
    assert ledger.used("h200") == 0


def test_a_pod_placed_on_a_known_gpu_at_readiness_joins_its_group() -> None:
    ledger = BudgetLedger({"h200": 2})
    t = Tracker(make_catalog(make_spec("gpu")), ledger)
    for name in ("a", "b"):
        assert ledger.reserve("h200", 1)
        t.add_pod(PodInfo(name, "gpu", 0.0), 0.0)
    t.pod_ready("a", 1.0, gpu="G0")
    t.pod_ready("b", 1.0, gpu="G0")
    assert ledger.used("h200") == 1
    assert state_of(t, "b") is PodState.IDLE


def test_a_card_whose_group_emptied_must_be_verified_again() -> None:
    t = gpu_tracker()
    group(t)
    for name in ("active", "standby0"):
        t.pod_gone(name, 1.0)
    assert not t.gpu_verified("G0")


def test_a_planned_standby_whose_card_emptied_since_the_plan_is_not_tracked() -> None:
    """Another thread can delete a card's last pod between a plan and its ``add_pod``: the
    card's unit went back to the ledger, so tracking the standby would re-open the group past
    the budget (the concurrency test once saw 6 cards on a budget of 5)."""
    t = gpu_tracker(budget=1)
    add_ready(t, "active", sku="gpu", gpu="G0")
    assert t.ledger.used("h200") == 1
    t.pod_gone("active", 1.0)
    assert t.ledger.used("h200") == 0
    standby = make_pod("late", "gpu", gpu="G0", role="standby")
    assert t.add_pod(standby, 2.0) is False
    assert t.get("late") is None and t.ledger.used("h200") == 0
    add_ready(t, "next", sku="gpu", gpu="G1")
    assert t.add_pod(make_pod("kept", "gpu", gpu="G1", role="standby"), 3.0) is True
    assert t.ledger.used("h200") == 1
