"""Builders that keep the control-plane tests short: pools, catalogs, pods, requests."""

from __future__ import annotations

import itertools
from typing import Any

from pool_manager.catalog import CallerLimits, Catalog, PoolSpec
from pool_manager.model import ClaimRequest, Lease, Miss, PodInfo
from pool_manager.states import PodState
from pool_manager.tracker import Tracker

_jobs = itertools.count(1)
_pods = itertools.count(1)


def make_spec(sku: str = "cpu", **knobs: Any) -> PoolSpec:
    if sku.startswith("gpu") or sku.startswith("h200"):
        knobs.setdefault("accelerator", "h200")
    return PoolSpec(sku=sku, **knobs)


def make_catalog(
    *specs: PoolSpec,
    budgets: dict[str, int] | None = None,
    limits: CallerLimits | None = None,
    caller_limits: dict[str, CallerLimits] | None = None,
) -> Catalog:
    pools = {s.sku: s for s in (specs or (make_spec(),))}
    return Catalog(
        pools=pools,
        budgets=budgets or {},
        limits=limits or CallerLimits(),
        caller_limits=caller_limits or {},
    )


def make_tracker(*specs: PoolSpec, **catalog_kw: Any) -> Tracker:
    return Tracker(make_catalog(*specs, **catalog_kw))


def make_pod(
    name: str | None = None,
    sku: str = "cpu",
    *,
    created: float = 0.0,
    state: PodState = PodState.STARTING,
    **fields: Any,
) -> PodInfo:
    return PodInfo(
        name=name or f"pod-{next(_pods)}", sku=sku, created=created, state=state, **fields
    )


def add_ready(
    tracker: Tracker, name: str | None = None, sku: str = "cpu", now: float = 0.0, **fields: Any
) -> str:
    """A pod created and ready at ``now`` (its budget recorded as if found, not planned)."""
    pod = make_pod(name, sku, created=now, **fields)
    tracker.add_pod(pod, now, reserved=False)
    tracker.pod_ready(pod.name, now)
    return pod.name


def make_request(
    caller: str = "alice",
    sku: str = "cpu",
    *,
    tag: str | None = None,
    queue: str = "default",
    pods: int = 1,
    single_use: bool = False,
    queued_at: float = 0.0,
    job_id: str | None = None,
) -> ClaimRequest:
    return ClaimRequest(
        job_id=job_id or f"job-{next(_jobs)}",
        caller=caller,
        sku=sku,
        lease_tag=tag,
        queue=queue,
        pods=pods,
        single_use=single_use,
        queued_at=queued_at,
    )


def lease(tracker: Tracker, req: ClaimRequest, now: float = 1.0) -> Lease:
    got = tracker.claim(req, now)
    assert isinstance(got, Lease), got
    return got


def miss(tracker: Tracker, req: ClaimRequest, now: float = 1.0) -> Miss:
    got = tracker.claim(req, now)
    assert isinstance(got, Miss), got
    return got


def run_job(tracker: Tracker, req: ClaimRequest, now: float = 1.0, clean: bool = True) -> Lease:
    """Claim, launch and release one job at ``now``; returns its lease."""
    got = lease(tracker, req, now)
    tracker.launched(req.job_id, now)
    tracker.release(req.job_id, clean, now)
    return got


def state_of(tracker: Tracker, name: str) -> PodState | None:
    pod = tracker.get(name)
    return None if pod is None else pod.state
