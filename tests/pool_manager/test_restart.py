"""Restart recovery of the tracker (paper A.1): holds, running jobs, budgets, fail-closed."""

from __future__ import annotations

from pool_manager.budgets import BudgetLedger
from pool_manager.model import DeletePod, PodInfo
from pool_manager.states import PodState
from pool_manager.tracker import RESTORED_HOLD_GRACE_S, Tracker
from tests.pool_manager.builders import (
    add_ready,
    lease,
    make_catalog,
    make_request,
    make_spec,
    make_tracker,
    miss,
    run_job,
    state_of,
)


def restarted(t: Tracker, now: float = 50.0) -> Tracker:
    fresh = Tracker(t.catalog, BudgetLedger(t.catalog.budgets))
    assert fresh.restore(t.pods(), now) == []
    return fresh


def test_owner_holds_survive_a_restart() -> None:
    t = make_tracker(make_spec(caller_hold_s=100.0))
    add_ready(t, "p")
    run_job(t, make_request("alice", tag="s"), now=10.0)
    t2 = restarted(t)
    miss(t2, make_request("bob"), now=51.0)
    assert lease(t2, make_request("alice", tag="s"), now=51.0).path == "warm"
    assert [d.name for d in restarted(t).expire(110.0)] == ["p"]


def test_a_running_job_is_reattached_and_can_be_released() -> None:
    t = make_tracker()
    add_ready(t, "p")
    job = make_request("alice")
    lease(t, job)
    t.launched(job.job_id, 2.0)
    t2 = restarted(t)
    assert t2.lease_of(job.job_id) == ("p",)
    [rel] = t2.release(job.job_id, True, 60.0)
    assert (rel.retire, state_of(t2, "p")) == (False, PodState.IDLE)


def test_a_claim_that_never_committed_comes_back_idle() -> None:
    t = make_tracker()
    add_ready(t, "p")
    job = make_request("alice")
    lease(t, job)
    t2 = restarted(t)
    assert t2.lease_of(job.job_id) is None
    assert lease(t2, make_request("bob"), now=51.0).pods == ("p",)


def test_the_ledger_is_rebuilt_one_reservation_per_group() -> None:
    t = make_tracker(make_spec("gpu", standbys_per_active=2), budgets={"h200": 4})
    add_ready(t, "a", sku="gpu", gpu="G0")
    add_ready(t, "s", sku="gpu", gpu="G0", role="standby")
    add_ready(t, "b", sku="gpu", gpu="G1")
    t2 = restarted(t)
    assert t2.ledger.used("h200") == 2


def test_a_retiring_pod_keeps_its_gpu_closed_after_a_restart() -> None:
    spec = make_spec("gpu", standbys_per_active=1)
    t = Tracker(make_catalog(spec))
    pods = [
        PodInfo("old", "gpu", 0.0, gpu="G0", state=PodState.RETIRING, owner="alice"),
        PodInfo("s", "gpu", 0.0, gpu="G0", role="standby", state=PodState.IDLE),
    ]
    t.restore(pods, 10.0)
    t.mark_gpu_verified("G0", True, 11.0)
    miss(t, make_request("bob", sku="gpu"), now=12.0)
    t.pod_gone("old", 13.0)
    assert lease(t, make_request("bob", sku="gpu"), now=14.0).path == "standby"


def test_pods_of_unknown_pools_are_returned_for_deletion() -> None:
    t = make_tracker()
    orphans = t.restore([PodInfo("x", "tpu", 0.0, state=PodState.IDLE)], 1.0)
    assert [(d.name, d.reason) for d in orphans] == [("x", "unknown_pod")]


def test_the_job_stores_caller_wins_over_a_missing_annotation() -> None:
    t = make_tracker()
    pod = PodInfo("p", "cpu", 0.0, state=PodState.RUNNING, job_id="j1")  # annotation lost
    req = make_request("alice", tag="s", job_id="j1")
    t.restore([pod], 10.0, jobs={"j1": req})
    t.release("j1", True, 11.0)
    assert lease(t, make_request("alice", tag="s"), now=12.0).path == "warm"


def test_a_pod_marked_to_retire_retires_after_its_reattached_job_or_at_once_if_idle() -> None:
    """The shell persists ``retire_after`` / ``single_use`` before the job runs; a restart
    that found such a pod came back with it held for its old session (adversarial run)."""
    t = make_tracker(make_spec(caller_hold_s=100.0))
    for name in ("busy", "done", "once"):
        add_ready(t, name)
    pods = {p.name: p for p in t.pods()}
    job = make_request("alice", tag="s2")
    pods["busy"].state, pods["busy"].job_id, pods["busy"].retire_after = (
        PodState.RUNNING, job.job_id, True
    )  # fmt: skip
    pods["done"].retire_after = True  # its job ended; the delete did not happen
    pods["done"].owner = pods["once"].owner = "alice"
    pods["once"].single_use = True
    fresh = Tracker(t.catalog, BudgetLedger(t.catalog.budgets))
    deletes = fresh.restore(pods.values(), 50.0, {job.job_id: job})
    assert sorted((d.name, d.reason) for d in deletes) == [
        ("done", "restored_retiring"), ("once", "restored_retiring")
    ]  # fmt: skip
    assert state_of(fresh, "done") is state_of(fresh, "once") is PodState.RETIRING
    [rel] = fresh.release(job.job_id, True, 60.0)
    assert (rel.name, rel.retire, rel.reason) == ("busy", True, "session_boundary")
    miss(fresh, make_request("alice", tag="s2"), now=61.0)


def test_no_hold_is_broken_in_the_grace_after_a_restart() -> None:
    """The first scaler passes after a restart see the queued jobs recovery put back before
    the owners of the held pods are back: they break no hold for ``RESTORED_HOLD_GRACE_S``;
    after it, a job blocked at the ceiling breaks one as it would have before the restart."""
    t = make_tracker(make_spec(max_count=2, caller_hold_s=1000.0))
    add_ready(t, "a-pod", now=0.0)
    run_job(t, make_request("alice"), now=100.0)
    add_ready(t, "c-pod", now=0.0)
    run_job(t, make_request("carol"), now=110.0)
    t2 = restarted(t, now=200.0)
    blocked = [make_request("bob")]
    assert [a for a in t2.reconcile(blocked, 200.0) if isinstance(a, DeletePod)] == []
    during = 200.0 + RESTORED_HOLD_GRACE_S - 0.1
    assert [a for a in t2.reconcile(blocked, during) if isinstance(a, DeletePod)] == []
    after = [
        a for a in t2.reconcile(blocked, 200.0 + RESTORED_HOLD_GRACE_S) if isinstance(a, DeletePod)
    ]
    assert [(a.name, a.reason) for a in after] == [("a-pod", "hold_broken")]
