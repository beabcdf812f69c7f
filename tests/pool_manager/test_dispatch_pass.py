"""One dispatcher pass (paper §3, A.1 step 1, A.2): jobs in order, the unplaceable ones wait.

A single-use job behind a miss for want of pods on its SKU waits without a claim; the pass
must still place and order exactly what claiming every job in turn would."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pool_manager.catalog import CallerLimits
from pool_manager.dispatch_pass import dispatch_pass
from pool_manager.model import ClaimRequest, Lease, PodInfo
from pool_manager.tracker import Tracker
from tests.pool_manager.builders import (
    add_ready,
    make_request,
    make_spec,
    make_tracker,
    run_job,
)


def _counting(t: Tracker) -> list[str]:
    """Record the job of every ``claim`` call on ``t``."""
    calls: list[str] = []
    real = t.claim

    def claim(req: ClaimRequest, now: float) -> Any:
        calls.append(req.job_id)
        return real(req, now)

    t.claim = claim  # type: ignore[method-assign]
    return calls


def test_single_use_jobs_behind_a_miss_on_their_sku_wait_without_a_claim() -> None:
    t = make_tracker()
    add_ready(t)
    jobs = [make_request(f"c{i}", single_use=True) for i in range(4)]
    calls = _counting(t)
    result = dispatch_pass(t, jobs, 1.0, reconcile=False, replan_waiting=False)
    assert [lease.job_id for lease in result.leases] == [jobs[0].job_id]
    assert list(result.waiting) == jobs[1:]
    assert calls == [jobs[0].job_id, jobs[1].job_id]  # the rest would miss as the second did


def test_a_caller_limit_miss_does_not_hold_back_other_callers() -> None:
    t = make_tracker(caller_limits={"alice": CallerLimits(max_pods=0)})
    add_ready(t)
    alice, bob = make_request("alice", single_use=True), make_request("bob", single_use=True)
    result = dispatch_pass(t, [alice, bob], 1.0, reconcile=False, replan_waiting=False)
    assert [lease.job_id for lease in result.leases] == [bob.job_id]
    assert list(result.waiting) == [alice]


def test_a_job_held_back_by_its_callers_limit_is_no_demand_for_the_scaler() -> None:
    """Alice at her own ``max_pods`` made the scaler break Bob's hold and start a pod she
    could not use, which Bob's next job then took as ``idle`` (adversarial run, 4 of 4)."""
    t = make_tracker(
        make_spec(min_count=0, max_count=2, caller_hold_s=100.0, hold_min_tenure_s=0.0),
        limits=CallerLimits(max_pods=1),
    )
    add_ready(t, "bobs")
    run_job(t, make_request("bob", tag="s"), now=1.0)
    add_ready(t, "alices")
    running = make_request("alice")
    got = t.claim(running, 2.0)
    assert isinstance(got, Lease)
    t.launched(running.job_id, 2.0)
    more = make_request("alice")
    result = dispatch_pass(t, [more], 3.0, reconcile=True)
    assert list(result.waiting) == [more] and result.leases == []
    assert result.actions == [], "no hold broken, no pod started for it"
    again = t.claim(make_request("bob", tag="s"), 4.0)
    assert isinstance(again, Lease) and again.path == "warm"


def test_a_callers_queued_jobs_count_as_demand_only_up_to_its_own_limit() -> None:
    """Three jobs of a ``max_pods: 1`` caller, none running yet: as demand for three pods at
    the ceiling they broke another caller's hold for pods the first could never use
    (adversarial run)."""
    t = make_tracker(
        make_spec(min_count=0, max_count=2, caller_hold_s=100.0, hold_min_tenure_s=0.0, step=4),
        limits=CallerLimits(max_pods=1),
    )
    add_ready(t, "bobs")
    run_job(t, make_request("bob", tag="s"), now=1.0)
    queued = [make_request("alice") for _ in range(3)]
    result = dispatch_pass(t, queued, 2.0, reconcile=True)
    assert list(result.waiting) == queued
    assert [type(a).__name__ for a in result.actions] == ["CreatePod"], result.actions


def test_a_gang_that_cannot_be_placed_is_not_overtaken_in_its_pool() -> None:
    """A priority-100 2-pod gang waited out a whole 40 s stream of 1-pod jobs: each pod
    that came free went to the next of them, and their owners' holds were spared because
    they had jobs queued (adversarial run, 4 of 4)."""
    t = make_tracker(
        make_spec(min_count=0, max_count=2, caller_hold_s=100.0, hold_min_tenure_s=0.0)
    )
    add_ready(t, "carols")
    run_job(t, make_request("carol", tag="s"), now=1.0)
    add_ready(t, "free")
    gang = make_request("alice", pods=2)
    other, warm = make_request("bob"), make_request("carol", tag="s")
    result = dispatch_pass(t, [gang, other, warm], 2.0, reconcile=True)
    assert result.leases == [] and list(result.waiting) == [gang, other, warm]
    assert [(type(a).__name__, getattr(a, "name", None)) for a in result.actions] == [
        ("DeletePod", "carols")
    ], "the gang's demand alone: carol's hold is broken for it, nothing is made for the rest"
    t.pod_gone("carols", 3.0)
    add_ready(t, "more", now=3.5)
    result = dispatch_pass(t, [gang, other, warm], 4.0, reconcile=False, replan_waiting=False)
    assert [lease.job_id for lease in result.leases] == [gang.job_id]
    assert list(result.waiting) == [other, warm]


def test_a_job_that_missed_is_not_overtaken_in_its_pool_by_lower_priority_ones() -> None:
    """A priority-100 job waited 10.9 s while a priority-0 backlog ran on warm pods whose
    holds were spared for it (adversarial run, 4 of 4)."""
    t = make_tracker(
        make_spec(min_count=0, max_count=1, caller_hold_s=100.0, hold_min_tenure_s=0.0)
    )
    add_ready(t, "lows")
    run_job(t, make_request("low", tag="s"), now=1.0)
    urgent = replace(make_request("high"), priority=100)
    backlog = [make_request("low", tag="s") for _ in range(3)]
    result = dispatch_pass(t, [urgent, *backlog], 2.0, reconcile=True)
    assert result.leases == [] and list(result.waiting) == [urgent, *backlog]
    assert [(type(a).__name__, getattr(a, "name", None)) for a in result.actions] == [
        ("DeletePod", "lows")
    ], "the backlog is no demand: its owner's hold is broken for the urgent job"
    peer = replace(make_request("peer"), priority=100)
    add_ready(t, "peers")
    run_job(t, replace(peer, job_id="peer-0"), now=2.5)
    result = dispatch_pass(t, [urgent, peer], 3.0, reconcile=False, replan_waiting=False)
    assert [lease.job_id for lease in result.leases] == [peer.job_id], "equal priority passes"


def test_a_smaller_single_use_job_is_still_tried_after_a_larger_one_misses() -> None:
    t = make_tracker(make_spec("gpu"))
    add_ready(t, sku="gpu", gpu="G0")
    add_ready(t, sku="gpu", gpu="G1")
    big = make_request("a", "gpu", pods=3, single_use=True)
    small = make_request("b", "gpu", pods=2, single_use=True)
    later = make_request("c", "gpu", single_use=True)
    calls = _counting(t)
    result = dispatch_pass(t, [big, small, later], 1.0, reconcile=False, replan_waiting=False)
    assert [lease.job_id for lease in result.leases] == [small.job_id]
    assert list(result.waiting) == [big, later]
    assert calls == [big.job_id, small.job_id, later.job_id]


def test_a_reusable_callers_miss_skips_single_use_jobs_on_that_sku_only() -> None:
    t = make_tracker(make_spec("cpu"), make_spec("gpu"))
    add_ready(t, sku="gpu", gpu="G0")
    reusable = make_request("a", "cpu")
    cpu_once = make_request("b", "cpu", single_use=True)
    gpu_once = make_request("c", "gpu", single_use=True)
    calls = _counting(t)
    result = dispatch_pass(t, [reusable, cpu_once, gpu_once], 1.0, False, replan_waiting=False)
    assert [lease.job_id for lease in result.leases] == [gpu_once.job_id]
    assert list(result.waiting) == [reusable, cpu_once]
    assert calls == [reusable.job_id, gpu_once.job_id]


# -- the pass against claiming every job in turn ------------------------------------------
_CALLERS = ("a", "b", "c")
_SKUS = ("cpu", "gpu", "nope")


def _build(pods: list[tuple[str, str, int, str | None]], limited: bool) -> Tracker:
    """A tracker with ``(sku, card, share, owner)`` pods, made ready at 0.0 in that order
    (``owner``: one job of theirs ran on it, so it is held for them)."""
    kw: dict[str, Any] = {"caller_limits": {"a": CallerLimits(max_pods=1)}} if limited else {}
    t = make_tracker(make_spec("cpu"), make_spec("gpu", standbys_per_active=1), **kw)
    for i, (sku, card, share, owner) in enumerate(pods):
        gpu = None if sku == "cpu" else f"G{card}"
        role = "standby" if gpu is not None and share else "active"
        pod = PodInfo(f"p{i}", sku, 0.0, role=role, gpu=gpu)
        t.add_pod(pod, 0.0, reserved=False)
        t.pod_ready(pod.name, 0.0)
        if owner is not None and role == "active" and t.get(pod.name) is not None:
            req = ClaimRequest(f"warm{i}", owner, sku, "s1")
            got = t.claim(req, 0.0)
            if isinstance(got, Lease):
                t.launched(req.job_id, 0.0)
                t.release(req.job_id, True, 0.0)
    for card in sorted({card for sku, card, _, _ in pods if sku == "gpu"}):
        t.mark_gpu_verified(f"G{card}", True, 0.0)
    return t


_pods = st.lists(
    st.tuples(
        st.sampled_from(("cpu", "gpu")),
        st.integers(0, 3),
        st.integers(0, 1),
        st.sampled_from((None, *_CALLERS)),
    ),
    max_size=8,
)
_requests = st.lists(
    st.tuples(
        st.sampled_from(_CALLERS),
        st.sampled_from(_SKUS),
        st.integers(1, 3),
        st.booleans(),
        st.sampled_from(("s1", "s2")),
        st.integers(0, 2),
        st.sampled_from((0.25, 0.5, 0.75)),
    ),
    max_size=10,
)


@settings(max_examples=300, deadline=None)
@given(_pods, _requests, st.booleans(), st.booleans())
def test_a_pass_places_orders_and_plans_exactly_what_claiming_every_job_would(
    pods: list[tuple[str, str, int, str | None]],
    requests: list[tuple[str, str, int, bool, str, int, float]],
    limited: bool,
    reconcile: bool,
) -> None:
    queue = sorted(
        (
            ClaimRequest(
                f"j{i}", caller, sku, tag, pods=n, single_use=once, queued_at=at, priority=priority
            )
            for i, (caller, sku, n, once, tag, priority, at) in enumerate(requests)
        ),
        key=lambda req: (-req.priority, req.queued_at),
    )
    fast, slow = _build(pods, limited), _build(pods, limited)
    result = dispatch_pass(fast, queue, 1.0, reconcile=reconcile, replan_waiting=False)
    leases: list[Lease] = []
    waiting: list[ClaimRequest] = []
    demand: list[ClaimRequest] = []
    # The reference: every job claimed in turn, except those a miss before them holds back
    # (below its priority in its pool; any job behind a gang), which are no demand either.
    missed_at: dict[str, float] = {}
    for req in queue:
        if req.priority < missed_at.get(req.sku, float("-inf")):
            waiting.append(req)
            continue
        got = slow.claim(req, 1.0)
        if isinstance(got, Lease):
            leases.append(got)
        else:
            waiting.append(req)
            demand.append(req)
            if got.reason in ("no_idle_pod", "gang_unplaceable"):
                if req.pods > 1 and not req.single_use:
                    missed_at[req.sku] = float("inf")
                else:
                    missed_at.setdefault(req.sku, req.priority)
    assert result.leases == leases
    assert list(result.waiting) == waiting
    if reconcile:  # the scaler saw the same demand: it planned the same
        within = list(slow.within_limits(demand).requests()) if limited else demand
        assert result.actions == slow.reconcile(within, 1.0)
    assert fast.pods() == slow.pods()
    assert [fast.history(p.name) for p in fast.pods()] == [
        slow.history(p.name) for p in slow.pods()
    ]


def test_held_pods_serve_their_owner_not_a_single_use_job() -> None:
    """The builder's held pods are real holds (the property test relies on them)."""
    t = make_tracker()
    name = add_ready(t)
    run_job(t, make_request("alice", tag="s1"), now=0.0)
    once = make_request("bob", single_use=True)
    result = dispatch_pass(t, [once], 1.0, reconcile=False, replan_waiting=False)
    assert list(result.waiting) == [once] and t.get(name) is not None
