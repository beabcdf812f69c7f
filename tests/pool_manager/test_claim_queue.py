"""The claim queue keeps dispatch order (priority, then age, then arrival) through pushes,
removals and claims, and a dispatch pass over it costs the classes queued and the jobs
placed, not the jobs queued (counted in claims, never timed)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pool_manager.claim_queue import ClaimQueue, Demand
from pool_manager.dispatch_pass import dispatch_pass
from pool_manager.model import Action, ClaimRequest, Lease, Miss
from tests.pool_manager.builders import add_ready, make_tracker

_jobs = st.lists(
    st.tuples(st.sampled_from("ab"), st.integers(0, 2), st.sampled_from((0.0, 1.0, 2.0))),
    max_size=40,
)


def _requests(jobs: list[tuple[str, int, float]]) -> list[ClaimRequest]:
    return [
        ClaimRequest(f"j{i}", caller, "cpu", "s", queued_at=at, priority=priority)
        for i, (caller, priority, at) in enumerate(jobs)
    ]


@settings(max_examples=200, deadline=None)
@given(_jobs, st.data())
def test_the_queue_yields_jobs_in_dispatch_order_through_pushes_removals_and_claims(
    jobs: list[tuple[str, int, float]], data: Any
) -> None:
    requests = _requests(jobs)
    queue = ClaimQueue(requests)
    order = sorted(requests, key=lambda r: (-r.priority, r.queued_at))  # stable: arrival
    assert list(queue) == order and len(queue) == len(order)
    gone = data.draw(st.sets(st.sampled_from([r.job_id for r in requests]))) if requests else set()
    for job_id in sorted(gone):
        assert queue.remove(job_id) is not None and queue.remove(job_id) is None
    order = [r for r in order if r.job_id not in gone]
    assert list(queue) == order and len(queue) == len(order)
    while order:  # claims take class heads; the rest keeps its order
        cls = data.draw(st.sampled_from(queue.classes()))
        head = cls.request()
        cls.take_head()
        queue.taken(cls, head)
        order.remove(head)
        assert list(queue) == order and head.job_id not in queue
    assert not queue and queue.classes() == []


def test_a_job_queued_again_goes_back_to_its_place_by_age() -> None:
    young, old, again = (
        ClaimRequest("young", "a", "cpu", "s", queued_at=2.0),
        ClaimRequest("old", "a", "cpu", "s", queued_at=1.0),
        ClaimRequest("again", "a", "cpu", "s", queued_at=1.0),  # a retry keeps its age
    )
    queue = ClaimQueue([old, young])
    queue.push(again)
    assert [r.job_id for r in queue] == ["old", "again", "young"]


def test_a_job_cannot_be_queued_twice() -> None:
    queue = ClaimQueue([ClaimRequest("j", "a", "cpu", "s")])
    try:
        queue.push(ClaimRequest("j", "a", "cpu", "s"))
    except ValueError as exc:
        assert "already queued" in str(exc)
    else:
        raise AssertionError("a second push of one job was accepted")


def test_a_deep_backlog_costs_a_pass_one_claim_per_placed_job_and_one_miss_per_class() -> None:
    """10,000 queued jobs of two callers on a pool of 4 idle pods: 4 claims that place and one
    miss per caller, whatever the depth; the scaler is handed the whole backlog as demand."""
    tracker = make_tracker()
    for _ in range(4):
        add_ready(tracker)
    claims: list[Lease | Miss] = []
    claim = tracker.claim

    def counted(req: ClaimRequest, now: float) -> Lease | Miss:
        got = claim(req, now)
        claims.append(got)
        return got

    tracker.claim = counted  # type: ignore[method-assign]
    queue = ClaimQueue(
        ClaimRequest(f"j{i}", "ab"[i % 2], "cpu", f"s{i % 2}", queued_at=float(i))
        for i in range(10_000)
    )
    seen: list[Demand] = []
    reconcile = tracker.reconcile

    def planned(demand: Demand, now: float) -> list[Action]:
        seen.append(demand)
        return reconcile(demand, now)

    tracker.reconcile = planned  # type: ignore[method-assign,assignment]
    result = dispatch_pass(tracker, queue, 1.0, reconcile=True)
    assert [lease.job_id for lease in result.leases] == ["j0", "j1", "j2", "j3"]
    assert sum(isinstance(got, Lease) for got in claims) == 4
    assert sum(isinstance(got, Miss) for got in claims) == 2  # one per class
    assert len(result.waiting) == 9_996 and next(iter(result.waiting)).job_id == "j4"
    (demand,) = seen
    assert sorted(run.jobs for run in demand) == [4_998, 4_998]
