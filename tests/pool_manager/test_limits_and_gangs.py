"""Per-caller limits and gangs (paper §4, A.1, A.2): checked and claimed in one step."""

from __future__ import annotations

from pool_manager.catalog import CallerLimits
from pool_manager.states import PodState
from tests.pool_manager.builders import (
    add_ready,
    lease,
    make_request,
    make_spec,
    make_tracker,
    miss,
    state_of,
)


def test_a_caller_never_holds_more_pods_than_its_limit() -> None:
    t = make_tracker(limits=CallerLimits(max_pods=2))
    for _ in range(3):
        add_ready(t)
    lease(t, make_request("alice"))
    lease(t, make_request("alice"))
    assert miss(t, make_request("alice")).reason == "caller_pod_limit"
    assert lease(t, make_request("bob")).path == "idle"


def test_a_released_pod_frees_the_callers_limit() -> None:
    t = make_tracker(limits=CallerLimits(max_pods=1))
    add_ready(t)
    add_ready(t)
    first = lease(t, make_request("alice"))
    miss(t, make_request("alice"))
    t.release(first.job_id, True, 2.0)
    lease(t, make_request("alice"), now=3.0)


def test_a_caller_never_holds_more_gpus_than_its_limit() -> None:
    t = make_tracker(make_spec("gpu8", units_per_pod=8), limits=CallerLimits(max_gpus=8))
    add_ready(t, sku="gpu8", gpu="G0")
    add_ready(t, sku="gpu8", gpu="G1")
    lease(t, make_request("alice", sku="gpu8"))
    assert miss(t, make_request("alice", sku="gpu8")).reason == "caller_gpu_limit"


def test_gpu_limits_do_not_count_cpu_pods() -> None:
    t = make_tracker(make_spec("cpu"), limits=CallerLimits(max_gpus=0))
    add_ready(t)
    lease(t, make_request("alice"))


def test_per_caller_overrides_win_over_the_default() -> None:
    t = make_tracker(
        limits=CallerLimits(max_pods=1), caller_limits={"trainer": CallerLimits(max_pods=3)}
    )
    for _ in range(3):
        add_ready(t)
    for _ in range(3):
        lease(t, make_request("trainer"))


def test_a_gang_is_limited_as_a_whole() -> None:
    t = make_tracker(limits=CallerLimits(max_pods=2))
    for _ in range(3):
        add_ready(t)
    assert miss(t, make_request("alice", pods=3)).reason == "caller_pod_limit"
    assert all(state_of(t, p.name) is PodState.IDLE for p in t.pods())


def test_a_gang_claims_all_its_pods_in_one_step() -> None:
    t = make_tracker(make_spec("gpu"))
    for i in range(4):
        add_ready(t, f"p{i}", sku="gpu", gpu=f"G{i}")
    got = lease(t, make_request("alice", sku="gpu", pods=4))
    assert sorted(got.pods) == ["p0", "p1", "p2", "p3"]
    assert all(state_of(t, p) is PodState.ASSIGNED for p in got.pods)


def test_a_gang_that_cannot_be_placed_holds_nothing() -> None:
    t = make_tracker(make_spec("gpu"))
    for i in range(3):
        add_ready(t, f"p{i}", sku="gpu", gpu=f"G{i}")
    assert miss(t, make_request("alice", sku="gpu", pods=4)).reason == "gang_unplaceable"
    assert all(state_of(t, f"p{i}") is PodState.IDLE for i in range(3))


def test_a_gang_takes_distinct_physical_gpus() -> None:
    t = make_tracker(make_spec("gpu", standbys_per_active=3))
    add_ready(t, "a0", sku="gpu", gpu="G0")
    add_ready(t, "s0", sku="gpu", gpu="G0", role="standby")
    add_ready(t, "a1", sku="gpu", gpu="G1")
    t.mark_gpu_verified("G0", True, 0.0)
    got = lease(t, make_request("alice", sku="gpu", pods=2))
    pods = {p.name: p for p in t.pods()}
    assert len({pods[name].gpu for name in got.pods}) == 2
    assert miss(t, make_request("bob", sku="gpu", pods=2)).reason == "gang_unplaceable"


def test_a_gang_that_cannot_be_placed_is_skipped_so_smaller_jobs_proceed() -> None:
    t = make_tracker()
    add_ready(t, "p0")
    add_ready(t, "p1")
    big = make_request("alice", pods=3)
    small = make_request("bob")
    leases, demand = t.claim_all([big, small], 1.0)
    assert [lease.job_id for lease in leases] == [small.job_id]
    assert demand == [big]


def test_a_gangs_lease_reports_its_coldest_path() -> None:
    t = make_tracker()
    add_ready(t, "mine")
    job = make_request("alice")
    lease(t, job)
    t.release(job.job_id, True, 2.0)
    add_ready(t, "fresh", now=0.5)
    got = lease(t, make_request("alice", pods=2, queued_at=1.0), now=3.0)
    assert sorted(got.pods) == ["fresh", "mine"]
    assert (got.path, got.reason) == ("idle", "no_owned_idle_pod")
