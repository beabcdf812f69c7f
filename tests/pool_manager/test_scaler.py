"""Scaler passes over a real tracker (paper §7, App. A.5): creates, deletes, holds, budgets."""

from __future__ import annotations

from pool_manager.budgets import BudgetLedger
from pool_manager.model import CreatePod, DeletePod, PodInfo
from pool_manager.scaler import plan
from pool_manager.states import PodState
from pool_manager.tracker import Tracker
from tests.pool_manager.builders import (
    add_ready,
    lease,
    make_catalog,
    make_request,
    make_spec,
    make_tracker,
    run_job,
    state_of,
)


def execute(t: Tracker, actions: list[CreatePod | DeletePod], now: float) -> list[str]:
    """What the broker's shell does: record creates as STARTING, leave deletes in flight."""
    names = []
    for i, action in enumerate(actions):
        if isinstance(action, CreatePod):
            name = f"{action.sku}-{now}-{i}"
            t.add_pod(PodInfo(name, action.sku, now, role=action.role, gpu=action.gpu), now)
            names.append(name)
    return names


def creates(actions: list[CreatePod | DeletePod]) -> list[CreatePod]:
    return [a for a in actions if isinstance(a, CreatePod)]


def deletes(actions: list[CreatePod | DeletePod], reason: str) -> list[str]:
    return [a.name for a in actions if isinstance(a, DeletePod) and a.reason == reason]


def test_queued_demand_creates_pods_and_reserves_their_budget() -> None:
    t = make_tracker(budgets={"cpu": 16})
    queued = [make_request() for _ in range(3)]
    actions = t.reconcile(queued, 0.0)
    assert len(creates(actions)) == 3
    assert t.ledger.used("cpu") == 3


def test_creates_in_flight_are_never_repeated_by_a_second_pass() -> None:
    t = make_tracker()
    queued = [make_request() for _ in range(3)]
    execute(t, t.reconcile(queued, 0.0), 0.0)
    assert creates(t.reconcile(queued, 1.0)) == []


def test_deletes_in_flight_are_never_repeated_by_a_second_pass() -> None:
    t = make_tracker(make_spec(idle_timeout_s=10.0, max_idle_count=0))
    add_ready(t, "a")
    add_ready(t, "b")
    first = t.reconcile([], 100.0)
    assert sorted(deletes(first, "scale_down")) == ["a", "b"]
    assert state_of(t, "a") is PodState.RETIRING
    assert deletes(t.reconcile([], 101.0), "scale_down") == []


def test_scale_down_never_goes_below_the_floor() -> None:
    t = make_tracker(make_spec(min_count=2, idle_timeout_s=10.0, max_idle_count=0))
    for name in "abc":
        add_ready(t, name)
    assert len(deletes(t.reconcile([], 100.0), "scale_down")) == 1
    assert deletes(t.reconcile([], 200.0), "scale_down") == []


def test_scale_down_only_removes_idle_pods_past_their_keep_alive() -> None:
    t = make_tracker(make_spec(idle_timeout_s=50.0, max_idle_count=0))
    add_ready(t, "old", now=0.0)
    add_ready(t, "young", now=60.0)
    assert deletes(t.reconcile([], 70.0), "scale_down") == ["old"]


def test_a_pod_claimed_after_planning_is_not_deleted() -> None:
    t = make_tracker(make_spec(idle_timeout_s=10.0, max_idle_count=0))
    add_ready(t, "p")
    actions = plan(t.snapshot(100.0), [], 100.0, t.ledger)
    assert deletes(actions, "scale_down") == ["p"]
    lease(t, make_request(), now=100.0)
    assert not t.retire("p", "scale_down", 100.0)


def test_starting_pods_are_supply() -> None:
    t = make_tracker()
    queued = [make_request()]
    execute(t, t.reconcile(queued, 0.0), 0.0)
    assert t.reconcile(queued, 5.0) == []


def test_held_pods_are_not_supply_for_other_callers() -> None:
    t = make_tracker()
    add_ready(t, "p")
    run_job(t, make_request("alice"))
    actions = t.reconcile([make_request("bob")], 2.0)
    assert len(creates(actions)) == 1


def test_the_ceiling_caps_creation() -> None:
    t = make_tracker(make_spec(max_count=2))
    actions = t.reconcile([make_request() for _ in range(5)], 0.0)
    assert len(creates(actions)) == 2


def test_the_budget_is_shared_by_every_pool_of_an_accelerator() -> None:
    small, big = make_spec("gpu1", accelerator="h200"), make_spec("gpu8", accelerator="h200",
                                                                  units_per_pod=8)  # fmt: skip
    ledger = BudgetLedger({"h200": 9})
    t = Tracker(make_catalog(small, big), ledger)
    queued = [make_request(sku="gpu8"), make_request(sku="gpu8"), make_request(sku="gpu1")]
    actions = t.reconcile(queued, 0.0)
    assert sorted(a.sku for a in creates(actions)) == ["gpu1", "gpu8"]
    assert ledger.used("h200") == 9


def test_a_failed_create_releases_its_budget() -> None:
    t = make_tracker(budgets={"cpu": 1})
    [name] = execute(t, t.reconcile([make_request()], 0.0), 0.0)
    assert t.ledger.used("cpu") == 1
    t.pod_gone(name, 1.0)
    assert t.ledger.used("cpu") == 0


def test_standbys_are_staged_on_every_active_gpu() -> None:
    t = make_tracker(make_spec("gpu", standbys_per_active=2))
    add_ready(t, "a", sku="gpu", gpu="G0")
    actions = t.reconcile([], 0.0)
    assert creates(actions) == [CreatePod("gpu", "standby", "G0")] * 2
    execute(t, actions, 0.0)
    assert creates(t.reconcile([], 1.0)) == []


def test_idle_old_template_pods_retire() -> None:
    t = make_tracker(make_spec(template="v2"))
    add_ready(t, "old", template="v1")
    assert deletes(t.reconcile([], 0.0), "stale_template") == ["old"]


def held_pool() -> Tracker:
    t = make_tracker(make_spec(max_count=2, caller_hold_s=1000.0))
    add_ready(t, "a-pod", now=0.0)
    run_job(t, make_request("alice"), now=100.0)
    add_ready(t, "c-pod", now=0.0)
    run_job(t, make_request("carol"), now=110.0)
    return t


def test_a_hold_is_broken_only_for_a_job_blocked_at_the_ceiling() -> None:
    t = held_pool()
    assert deletes(t.reconcile([], 200.0), "hold_broken") == []
    assert deletes(t.reconcile([make_request("bob")], 200.0), "hold_broken") == ["a-pod"]


def test_hold_breaking_takes_the_oldest_hold_first_and_retires_it() -> None:
    t = held_pool()
    actions = t.reconcile([make_request("bob")], 200.0)
    assert deletes(actions, "hold_broken") == ["a-pod"]
    assert state_of(t, "a-pod") is PodState.RETIRING
    assert state_of(t, "c-pod") is PodState.IDLE


def test_hold_breaking_spares_owners_with_queued_jobs() -> None:
    t = held_pool()
    queued = [make_request("bob"), make_request("alice", pods=3)]
    actions = t.reconcile(queued, 200.0)
    assert deletes(actions, "hold_broken") == ["c-pod"]


def test_a_single_use_job_does_not_spare_its_owners_hold() -> None:
    """A held pod is never clean enough for a single-use job, so that job's owner is not
    spared: its own hold is broken for it (it used to wait the whole hold out)."""
    t = held_pool()
    actions = t.reconcile([make_request("alice", single_use=True)], 200.0)
    assert deletes(actions, "hold_broken") == ["a-pod"]


def test_hold_breaking_respects_the_minimum_tenure() -> None:
    t = make_tracker(make_spec(max_count=1, caller_hold_s=1000.0, hold_min_tenure_s=60.0))
    add_ready(t, "p", now=0.0)
    run_job(t, make_request("alice"), now=10.0)
    assert deletes(t.reconcile([make_request("bob")], 30.0), "hold_broken") == []
    assert deletes(t.reconcile([make_request("bob")], 60.0), "hold_broken") == ["p"]


def test_a_broken_hold_is_never_handed_to_another_caller() -> None:
    t = held_pool()
    t.reconcile([make_request("bob")], 200.0)
    leases, demand = t.claim_all([make_request("bob")], 201.0)
    assert leases == [] and len(demand) == 1


def test_a_standby_group_counts_once_in_the_ceiling() -> None:
    t = make_tracker(make_spec("gpu", standbys_per_active=2, max_count=1))
    add_ready(t, "a", sku="gpu", gpu="G0")
    add_ready(t, "s0", sku="gpu", gpu="G0", role="standby")
    add_ready(t, "s1", sku="gpu", gpu="G0", role="standby")
    view = t.snapshot(0.0).pools["gpu"]
    assert view.physical == 1
    assert creates(t.reconcile([make_request("bob", sku="gpu", pods=2)], 0.0)) == []


def test_concurrent_scaler_passes_never_overshoot_the_budget() -> None:
    import threading

    t = make_tracker(budgets={"cpu": 5})
    queued = [make_request() for _ in range(50)]
    made: list[int] = []

    def scaler_pass() -> None:
        made.append(len(creates(t.reconcile(queued, 0.0))))

    threads = [threading.Thread(target=scaler_pass) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(made) == 5 and t.ledger.used("cpu") == 5


def test_a_single_use_job_is_demand_even_when_its_caller_holds_a_pod() -> None:
    """A held pod is supply only for its owner's *reusable* jobs: single-use jobs never run on
    a used pod, so counting it would leave them queued forever."""
    t = make_tracker(make_spec(max_idle_count=0, caller_hold_s=600.0))
    add_ready(t, "a")
    run_job(t, make_request("alice", tag="t"), now=1.0)  # 'a' is now held for alice
    actions = t.reconcile([make_request("alice", single_use=True)], 2.0)
    assert len(creates(actions)) == 1


def _two_pools_on_one_budget(**knobs: object) -> Tracker:
    """Pools ``a`` and ``b`` share a 2-core budget; ``a`` holds both cores with idle pods
    its idle cap (2) would retain past their 10 s keep-alive."""
    spec = {"max_idle_count": 2, "idle_timeout_s": 10.0, **knobs}
    t = Tracker(make_catalog(make_spec("a", **spec), make_spec("b", **spec), budgets={"cpu": 2}))
    add_ready(t, "a1", "a")
    add_ready(t, "a2", "a")
    return t


def test_the_idle_cap_retains_past_the_keep_alive_when_no_other_pool_waits() -> None:
    t = _two_pools_on_one_budget()
    assert t.reconcile([], 100.0) == []
    assert t.reconcile([make_request(sku="a")], 100.0) == []  # its own job takes a1


def test_a_pool_blocked_by_the_budget_reclaims_other_pools_expired_idle_pods() -> None:
    t = _two_pools_on_one_budget()
    waiting = [make_request("bob", "b")]
    assert t.reconcile(waiting, 5.0) == [], "within the keep-alive nothing is reclaimed"
    first = t.reconcile(waiting, 100.0)
    assert deletes(first, "budget_reclaim") == ["a1"] and creates(first) == []
    # a1 is retiring and will free its core: the next pass reclaims nothing more
    assert deletes(t.reconcile(waiting, 101.0), "budget_reclaim") == []
    t.pod_gone("a1", 160.0)
    assert [a.sku for a in creates(t.reconcile(waiting, 161.0))] == ["b"]
    assert state_of(t, "a2") is PodState.IDLE, "one waiting pod reclaims one core"


def test_budget_reclaim_spares_floors_and_owner_holds() -> None:
    t = _two_pools_on_one_budget(min_count=1)
    waiting = [make_request("bob", "b")]
    assert deletes(t.reconcile(waiting, 100.0), "budget_reclaim") == ["a1"]  # a2 is the floor
    held = _two_pools_on_one_budget(caller_hold_s=1000.0)
    for name in ("a1", "a2"):  # alice's jobs leave both pods held for her
        run_job(held, make_request("alice", "a", tag=name), 1.0)
    assert deletes(held.reconcile(waiting, 100.0), "budget_reclaim") == []


def test_budget_reclaim_frees_whole_pods_of_the_waiting_size_and_no_more() -> None:
    """An 8-GPU job waits on a 9-GPU budget held by a 1-GPU pool's idle pods: it needs 8
    GPUs free, so 8 of the 9 expired 1-GPU pods retire, the oldest first."""
    small = make_spec("gpu1", accelerator="h200", max_idle_count=9, max_count=9,
                      idle_timeout_s=10.0)  # fmt: skip
    big = make_spec("gpu8", accelerator="h200", units_per_pod=8, max_count=1)
    t = Tracker(make_catalog(small, big, budgets={"h200": 9}))
    for i in range(9):
        add_ready(t, f"s{i}", "gpu1", gpu=f"card{i}")
    actions = t.reconcile([make_request("bob", "gpu8")], 100.0)
    assert len(deletes(actions, "budget_reclaim")) == 8 and creates(actions) == []
