"""Claim order per SKU (paper §5 rule 1): own held pod, never-used idle, standby, new."""

from __future__ import annotations

from pool_manager.states import PodState
from tests.pool_manager.builders import (
    add_ready,
    lease,
    make_request,
    make_spec,
    make_tracker,
    miss,
    run_job,
    state_of,
)


def test_the_callers_own_held_pod_is_claimed_first_and_is_warm() -> None:
    t = make_tracker()
    own = add_ready(t, "own")
    run_job(t, make_request("alice"))
    add_ready(t, "fresh", now=2.0)
    got = lease(t, make_request("alice"), now=3.0)
    assert got.pods == (own,)
    assert (got.path, got.reason) == ("warm", None)


def test_a_never_used_idle_pod_comes_next_and_says_why() -> None:
    t = make_tracker()
    add_ready(t, "fresh", now=0.0)
    got = lease(t, make_request("alice", queued_at=5.0), now=6.0)
    assert (got.pods, got.path, got.reason) == (("fresh",), "idle", "no_owned_idle_pod")


def test_an_idle_pod_taken_past_the_callers_own_says_the_session_kept_it_off_them() -> None:
    """The caller owns an idle pod of another session: the reason is the boundary, not
    ``no_owned_idle_pod`` (adversarial run: it said so while /v1/pools listed hers)."""
    t = make_tracker()
    add_ready(t, "hers")
    run_job(t, make_request("alice", tag="s1"))
    add_ready(t, "fresh", now=2.0)
    got = lease(t, make_request("alice", tag="s2", queued_at=3.0), now=3.0)
    assert (got.pods, got.path, got.reason) == (("fresh",), "idle", "tag_changed")
    add_ready(t, "fresh2", now=3.5)
    other = make_request("alice", tag="s1", queue="eval", queued_at=4.0)
    assert lease(t, other, now=4.0).reason == "queue_changed"


def test_a_pod_that_became_ready_after_the_job_was_queued_is_new() -> None:
    t = make_tracker()
    add_ready(t, "made-for-it", now=10.0)
    got = lease(t, make_request("alice", queued_at=5.0), now=10.0)
    assert got.path == "new"
    assert got.reason == "no_idle_pod_when_queued"


def test_a_standby_is_promoted_only_when_no_idle_pod_is_left() -> None:
    t = make_tracker(make_spec("gpu", standbys_per_active=3))
    add_ready(t, "active", sku="gpu", gpu="G0")
    add_ready(t, "standby", sku="gpu", gpu="G0", role="standby")
    t.mark_gpu_verified("G0", True, 0.0)
    first = lease(t, make_request("alice", sku="gpu"))
    assert (first.pods, first.path) == (("active",), "idle")
    t.launched(first.job_id, 1.0)
    t.release(first.job_id, True, 2.0)  # held for alice, gate open again
    second = lease(t, make_request("bob", sku="gpu"), now=3.0)
    assert (second.pods, second.path, second.reason) == (("standby",), "standby", "no_idle_pod")
    pod = t.get("standby")
    assert pod is not None and pod.role == "active"


def test_no_claimable_pod_is_a_miss_and_the_job_stays_queued() -> None:
    t = make_tracker()
    assert miss(t, make_request("alice")).reason == "no_idle_pod"


def test_an_unknown_sku_is_a_miss() -> None:
    t = make_tracker()
    assert miss(t, make_request("alice", sku="tpu")).reason == "unknown_sku"


def test_a_starting_pod_is_not_claimable_until_ready() -> None:
    from tests.pool_manager.builders import make_pod

    t = make_tracker()
    t.add_pod(make_pod("p"), 0.0, reserved=False)
    miss(t, make_request())
    t.pod_ready("p", 1.0)
    assert lease(t, make_request(), now=2.0).pods == ("p",)
    assert state_of(t, "p") is PodState.ASSIGNED


def test_a_pod_is_never_leased_twice() -> None:
    t = make_tracker()
    add_ready(t, "only")
    lease(t, make_request("alice"))
    miss(t, make_request("alice"))
    miss(t, make_request("bob"))


def test_a_new_session_prefers_a_never_used_pod_over_recycling_its_old_one() -> None:
    t = make_tracker()
    add_ready(t, "old")
    run_job(t, make_request("alice", tag="s1"))
    add_ready(t, "fresh", now=0.5)
    got = lease(t, make_request("alice", tag="s2", queued_at=1.0), now=2.0)
    assert (got.pods, got.path) == (("fresh",), "idle")
    assert state_of(t, "old") is PodState.IDLE  # still warm for session s1


def test_a_new_session_recycles_its_old_pod_rather_than_wait() -> None:
    t = make_tracker()
    add_ready(t, "old")
    run_job(t, make_request("alice", tag="s1"))
    got = lease(t, make_request("alice", tag="s2"), now=2.0)
    assert (got.pods, got.path, got.reason) == (("old",), "recycled", "tag_changed")


def test_a_standby_comes_before_recycling() -> None:
    t = make_tracker(make_spec("gpu", standbys_per_active=1))
    add_ready(t, "old", sku="gpu", gpu="G0")
    add_ready(t, "standby", sku="gpu", gpu="G1", role="standby")
    t.mark_gpu_verified("G1", True, 0.0)
    run_job(t, make_request("alice", sku="gpu", tag="s1"))
    got = lease(t, make_request("alice", sku="gpu", tag="s2"), now=2.0)
    assert (got.pods, got.path) == (("standby",), "standby")
