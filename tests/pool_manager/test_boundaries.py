"""Reuse boundaries (paper §5 rules 1-3, App. A.3): owner-only reuse, sessions, holds."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pool_manager.dispatch_pass import dispatch_pass
from pool_manager.model import DeletePod
from pool_manager.states import IllegalTransition, PodState
from pool_manager.tracker import Tracker
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


def test_a_used_pod_is_never_claimed_by_another_caller() -> None:
    t = make_tracker()
    add_ready(t, "p")
    run_job(t, make_request("alice"))
    assert miss(t, make_request("bob"), now=2.0).reason == "no_idle_pod"
    assert lease(t, make_request("alice"), now=3.0).pods == ("p",)


def test_a_released_pod_is_held_for_its_owner_until_the_hold_ends() -> None:
    t = make_tracker(make_spec(caller_hold_s=30.0))
    add_ready(t, "p")
    run_job(t, make_request("alice"), now=10.0)
    pod = t.get("p")
    assert pod is not None
    assert (pod.state, pod.owner, pod.hold_until) == (PodState.IDLE, "alice", 40.0)


def test_the_hold_defaults_to_the_idle_timeout() -> None:
    assert make_spec(idle_timeout_s=77.0).hold_s == 77.0


def test_hold_expiry_retires_the_pod_never_hands_it_on() -> None:
    t = make_tracker(make_spec(caller_hold_s=30.0))
    add_ready(t, "p")
    run_job(t, make_request("alice"), now=10.0)
    assert t.expire(39.9) == []
    deletes = t.expire(40.0)
    assert [(d.name, d.reason) for d in deletes] == [("p", "hold_expired")]
    assert state_of(t, "p") is PodState.RETIRING
    miss(t, make_request("alice"), now=41.0)
    miss(t, make_request("bob"), now=41.0)


def test_a_new_tag_runs_once_on_the_old_pod_which_then_retires() -> None:
    t = make_tracker()
    add_ready(t, "p")
    run_job(t, make_request("alice", tag="s1"))
    got = lease(t, make_request("alice", tag="s2"), now=2.0)
    assert (got.pods, got.path, got.reason) == (("p",), "recycled", "tag_changed")
    t.launched(got.job_id, 2.0)
    [rel] = t.release(got.job_id, True, 3.0)
    assert (rel.name, rel.retire, rel.reason) == ("p", True, "session_boundary")
    assert state_of(t, "p") is PodState.RETIRING


def test_a_queue_switch_runs_once_on_the_old_pod_which_then_retires() -> None:
    t = make_tracker()
    add_ready(t, "p")
    run_job(t, make_request("alice", queue="train"))
    got = lease(t, make_request("alice", queue="eval"), now=2.0)
    assert (got.path, got.reason) == ("recycled", "queue_changed")
    [rel] = t.release(got.job_id, True, 3.0)
    assert rel.retire


def test_the_same_tag_and_queue_reuse_the_pod_without_retiring_it() -> None:
    t = make_tracker()
    add_ready(t, "p")
    for step in range(5):
        got = run_job(t, make_request("alice", tag="s", queue="q"), now=float(step))
        assert got.pods == ("p",)
    assert state_of(t, "p") is PodState.IDLE


def test_in_hint_mode_a_new_tag_reuses_the_pod_without_retiring_it() -> None:
    t = make_tracker(make_spec(tag_mode="hint"))
    add_ready(t, "p")
    run_job(t, make_request("alice", tag="s1"))
    got = lease(t, make_request("alice", tag="s2"), now=2.0)
    assert (got.pods, got.path) == (("p",), "warm")
    [rel] = t.release(got.job_id, True, 3.0)
    assert not rel.retire


def test_in_hint_mode_the_matching_tag_is_preferred() -> None:
    t = make_tracker(make_spec(tag_mode="hint"))
    add_ready(t, "a")
    add_ready(t, "b")
    ja, jb = make_request("alice", tag="A"), make_request("alice", tag="B")
    la, lb = lease(t, ja), lease(t, jb)
    for job in (ja, jb):
        t.release(job.job_id, True, 2.0)
    assert lease(t, make_request("alice", tag="A"), now=3.0).pods == la.pods
    assert lease(t, make_request("alice", tag="B"), now=3.0).pods == lb.pods


def test_in_hint_mode_a_queue_switch_still_recycles() -> None:
    t = make_tracker(make_spec(tag_mode="hint"))
    add_ready(t, "p")
    run_job(t, make_request("alice", queue="a"))
    assert lease(t, make_request("alice", queue="b"), now=2.0).path == "recycled"


def test_an_unclean_reset_retires_the_pod() -> None:
    t = make_tracker()
    add_ready(t, "p")
    got = lease(t, make_request("alice"))
    [rel] = t.release(got.job_id, False, 2.0)
    assert (rel.retire, rel.reason) == (True, "unclean_reset")


def test_a_single_use_job_takes_only_a_never_used_pod_and_retires_it() -> None:
    t = make_tracker()
    add_ready(t, "used")
    run_job(t, make_request("alice"))
    assert miss(t, make_request("alice", single_use=True), now=2.0).reason == "no_idle_pod"
    add_ready(t, "clean", now=0.5)
    got = lease(t, make_request("alice", single_use=True, queued_at=1.0), now=2.0)
    assert (got.pods, got.path) == (("clean",), "single_use")
    [rel] = t.release(got.job_id, True, 3.0)
    assert (rel.retire, rel.reason) == (True, "single_use")


def test_an_old_template_pod_retires_on_release() -> None:
    t = make_tracker(make_spec(template="v2"))
    add_ready(t, "old", template="v1")
    got = lease(t, make_request("alice"))
    [rel] = t.release(got.job_id, True, 2.0)
    assert (rel.retire, rel.reason) == (True, "stale_template")


def test_a_failed_commit_puts_the_pods_back_exactly_as_they_were() -> None:
    t = make_tracker()
    add_ready(t, "p")
    run_job(t, make_request("alice", tag="s"), now=5.0)
    before = t.get("p")
    got = lease(t, make_request("alice", tag="s"), now=6.0)
    t.unclaim(got.job_id, 6.0)
    after = t.get("p")
    assert before is not None and after is not None
    fields = ("state", "owner", "tag", "queue", "released_at", "hold_until", "role", "job_id")
    assert [getattr(after, f) for f in fields] == [getattr(before, f) for f in fields]
    assert lease(t, make_request("alice", tag="s"), now=7.0).path == "warm"


def test_unclaim_after_launch_is_rejected() -> None:
    t = make_tracker()
    add_ready(t, "p")
    got = lease(t, make_request())
    t.launched(got.job_id, 1.0)
    with pytest.raises(IllegalTransition):
        t.unclaim(got.job_id, 1.0)


def test_a_found_held_pod_gets_a_hold_that_ends() -> None:
    from pool_manager.model import PodInfo

    t = make_tracker(make_spec(caller_hold_s=30.0))
    t.add_pod(
        PodInfo("p", "cpu", 0.0, state=PodState.IDLE, owner="alice", released_at=5.0),
        10.0,
        reserved=False,
    )
    assert [d.name for d in t.expire(35.0)] == ["p"]


def test_a_job_cannot_hold_two_leases() -> None:
    t = make_tracker()
    add_ready(t)
    add_ready(t)
    job = make_request("alice")
    lease(t, job)
    with pytest.raises(ValueError):
        t.claim(job, 2.0)


def held_pods(t: Tracker, caller: str, tags: list[str | None]) -> list[str]:
    """Names of ``caller``'s idle pods, one per tag in ``tags``, each released once.

    In ``switch`` mode a caller has one live session per queue (each new tag retires the
    others' pods, busy ones after their job), so several held sessions exist there only
    after a restart from another tag mode: they are built in a ``retire`` pool and
    restored into ``t`` beside its own pods (which must be idle)."""
    specs = list(t.catalog.pools.values())
    src = t if specs[0].tag_mode != "switch" else make_tracker(
        *(replace(spec, tag_mode="retire") for spec in specs)
    )  # fmt: skip
    names = []
    for i, tag in enumerate(tags):
        names.append(add_ready(src, f"{tag}-{i}"))
    leases = [lease(src, make_request(caller, tag=tag)) for tag in tags]
    for got in leases:
        src.launched(got.job_id, 1.0)
        src.release(got.job_id, True, 1.0)
    if src is not t:
        t.restore(t.pods() + src.pods(), 1.0)
        for pod in t.pods():
            if pod.gpu is not None:
                t.mark_gpu_verified(pod.gpu, True, 1.0)
    return names


def test_in_retire_mode_each_old_session_pod_runs_one_job_of_a_new_session() -> None:
    t = make_tracker()
    held_pods(t, "alice", ["s1", "s2", "s3"])
    paths = [lease(t, make_request("alice", tag="new"), now=2.0).path for _ in range(3)]
    assert paths == ["recycled"] * 3
    assert t.take_retired() == []


def test_in_switch_mode_a_new_session_recycles_one_old_pod_and_retires_the_rest() -> None:
    t = make_tracker(make_spec(tag_mode="switch"))
    old = held_pods(t, "alice", ["s1", "s2", "s3"])
    got = lease(t, make_request("alice", tag="new"), now=2.0)
    assert (got.path, got.reason) == ("recycled", "tag_changed")
    retired = sorted(d.name for d in t.take_retired())
    assert retired == sorted(set(old) - set(got.pods))
    assert {d.reason for d in t.expire(3.0)} <= {"hold_expired"}  # handed out only once
    assert all(state_of(t, name) is PodState.RETIRING for name in retired)
    assert miss(t, make_request("alice", tag="new2"), now=2.0).reason == "no_idle_pod"


def test_in_switch_mode_a_new_session_on_a_clean_pod_still_ends_the_old_one() -> None:
    t = make_tracker(make_spec(tag_mode="switch"))
    [old] = held_pods(t, "alice", ["s1"])
    add_ready(t, "clean", now=1.5)
    got = lease(t, make_request("alice", tag="s2", queued_at=2.0), now=2.0)
    assert (got.pods, got.path) == (("clean",), "idle")
    assert [(d.name, d.reason) for d in t.expire(2.0)] == [(old, "session_switched")]


def test_in_switch_mode_a_pod_busy_with_the_old_session_retires_after_its_job() -> None:
    """It came back held for the old tag, and a later job of the new session recycled it:
    two jobs of the new session on the old one's pods (adversarial run, 4 of 4)."""
    t = make_tracker(make_spec(tag_mode="switch"))
    add_ready(t, "busy")
    old_job = make_request("alice", tag="s1")
    lease(t, old_job)
    t.launched(old_job.job_id, 1.0)
    add_ready(t, "clean", now=1.5)
    assert lease(t, make_request("alice", tag="s2", queued_at=2.0), now=2.0).path == "idle"
    [rel] = t.release(old_job.job_id, True, 3.0)
    assert (rel.name, rel.retire, rel.reason) == ("busy", True, "session_boundary")
    assert miss(t, make_request("alice", tag="s2"), now=4.0).reason == "no_idle_pod"


def test_in_switch_mode_other_queues_other_callers_and_the_same_session_are_untouched() -> None:
    t = make_tracker(make_spec(tag_mode="switch"))
    add_ready(t, "eval-pod")
    run_job(t, make_request("alice", tag="s1", queue="eval"))
    add_ready(t, "bobs")
    run_job(t, make_request("bob", tag="s1"))
    [mine] = held_pods(t, "alice", ["s1"])
    add_ready(t, "clean", now=1.5)
    assert lease(t, make_request("alice", tag="s1"), now=2.0).pods == (mine,)  # warm: no switch
    assert lease(t, make_request("alice", tag="s2", queued_at=2.0), now=2.0).path == "idle"
    assert t.take_retired() == []
    assert state_of(t, "eval-pod") is PodState.IDLE and state_of(t, "bobs") is PodState.IDLE


def test_a_dispatch_pass_hands_out_switch_deletes_even_when_it_does_not_plan() -> None:
    t = make_tracker(make_spec(tag_mode="switch", min_count=0))
    old = held_pods(t, "alice", ["s1", "s2"])
    result = dispatch_pass(t, [make_request("alice", tag="s3")], 2.0, reconcile=False)
    [got] = result.leases
    assert got.path == "recycled"
    assert [(a.name, a.reason) for a in result.actions if isinstance(a, DeletePod)] == [
        (name, "session_switched") for name in old if name not in got.pods
    ]
