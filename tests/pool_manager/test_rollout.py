"""Template rollout and catalog swaps in the tracker and scaler (paper App. C.3): old-template
pods retire at most ``drain_budget`` groups at a time, a pool never holds more than its
ceiling, every job placed runs to its end, and a catalog swap that would strand a running
job changes nothing."""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pool_manager.catalog import CallerLimits, Catalog
from pool_manager.catalog_change import CatalogChangeRefused
from pool_manager.model import CreatePod, DeletePod, Lease, PodInfo
from pool_manager.states import PodState
from pool_manager.tracker import Tracker
from tests.pool_manager.builders import (
    add_ready,
    lease,
    make_catalog,
    make_request,
    make_spec,
    make_tracker,
    state_of,
)

_NEVER = math.inf


def _retiring(t: Tracker, sku: str = "cpu") -> list[str]:
    return [p.name for p in t.pods() if p.sku == sku and p.state is PodState.RETIRING]


def _rolled(t: Tracker, template: str, **knobs: object) -> Catalog:
    """``t``'s catalog with every pool's template set to ``template`` (and ``knobs``)."""
    pools = {
        sku: dataclasses.replace(spec, template=template, **knobs)  # type: ignore[arg-type]
        for sku, spec in t.catalog.pools.items()
    }
    return dataclasses.replace(t.catalog, pools=pools)


def test_the_scaler_retires_old_template_pods_within_the_drain_budget() -> None:
    t = make_tracker(make_spec(drain_budget=2, max_count=8, max_idle_count=8))
    for i in range(5):
        add_ready(t, f"old-{i}")
    assert t.swap_catalog(_rolled(t, "v2"), 1.0) == []
    first = [a.name for a in t.reconcile([], 1.0) if isinstance(a, DeletePod)]
    assert len(first) == 2 and sorted(_retiring(t)) == sorted(first)
    assert [a for a in t.reconcile([], 2.0) if isinstance(a, DeletePod)] == []  # at the budget
    t.pod_gone(first[0], 3.0)
    again = [a for a in t.reconcile([], 3.0) if isinstance(a, DeletePod)]
    assert [a.reason for a in again] == ["stale_template"]
    assert len(_retiring(t)) == 2


def test_an_old_template_pod_past_the_budget_is_held_and_serves_on() -> None:
    t = make_tracker(make_spec(drain_budget=1, caller_hold_s=0.0))
    add_ready(t, "a")
    add_ready(t, "b")
    ra, rb = make_request("alice"), make_request("bob")
    (a,) = lease(t, ra).pods
    (b,) = lease(t, rb).pods
    t.swap_catalog(_rolled(t, "v2"), 1.0)
    assert [r.reason for r in t.release(ra.job_id, True, 2.0)] == ["stale_template"]
    # the budget is taken: bob's pod is not retired, even with no owner hold to keep it
    assert [(r.retire, r.reason) for r in t.release(rb.job_id, True, 2.0)] == [(False, "held")]
    assert state_of(t, b) is PodState.IDLE
    assert t.expire(3.0) == []  # its (zero) hold ended, but the budget is still taken
    again = make_request("bob")
    assert lease(t, again, 3.5).pods == (b,)  # and it serves its owner on
    assert [r.retire for r in t.release(again.job_id, True, 3.6)] == [False]
    t.pod_gone(a, 4.0)
    # the budget is free again: the pass retires it (its ended hold, or the rollout's delete)
    assert [x.name for x in t.reconcile([], 4.0) if isinstance(x, DeletePod)] == [b]
    assert _retiring(t) == [b]


def test_a_swap_that_removes_a_pool_running_a_job_changes_nothing() -> None:
    t = make_tracker(make_spec("cpu"), make_spec("gpu", units_per_pod=1))
    add_ready(t, "g", sku="gpu")
    req = make_request("alice", sku="gpu")
    lease(t, req)
    old = t.catalog
    with pytest.raises(CatalogChangeRefused, match="pool 'gpu' is removed but 1 of its pods"):
        t.swap_catalog(make_catalog(make_spec("cpu")), 2.0)
    assert t.catalog is old and t.lease_of(req.job_id) == ("g",)
    t.release(req.job_id, True, 3.0)
    assert state_of(t, "g") is PodState.IDLE


def test_a_removed_pool_s_idle_pods_are_deleted_and_forgotten() -> None:
    t = make_tracker(make_spec("cpu"), make_spec("big", min_count=1))
    add_ready(t, "b1", sku="big")
    out = t.swap_catalog(make_catalog(make_spec("cpu")), 1.0)
    assert [(d.name, d.reason) for d in out] == [("b1", "pool_removed")]
    assert "big" not in t.snapshot(1.0).pools
    assert all(isinstance(a, CreatePod) and a.sku == "cpu" for a in t.reconcile([], 1.5))
    t.pod_gone("b1", 2.0)
    assert t.get("b1") is None


def test_a_pool_with_pods_cannot_change_its_units() -> None:
    t = make_tracker(make_spec("cpu", units_per_pod=1), budgets={"cpu": 8})
    add_ready(t, "c")
    with pytest.raises(CatalogChangeRefused, match="units_per_pod"):
        t.swap_catalog(make_catalog(make_spec("cpu", units_per_pod=2), budgets={"cpu": 8}), 1.0)
    assert t.catalog.pools["cpu"].units_per_pod == 1


def test_new_limits_count_the_leases_already_running() -> None:
    t = make_tracker(make_spec(max_count=8))
    add_ready(t, "a")
    add_ready(t, "b")
    lease(t, make_request("alice"))
    limited = make_catalog(make_spec(max_count=8), limits=CallerLimits(max_pods=1))
    t.swap_catalog(limited, 1.0)
    assert t.claim(make_request("alice"), 2.0).reason == "caller_pod_limit"  # type: ignore[union-attr]
    assert isinstance(t.claim(make_request("bob"), 2.0), Lease)


def test_a_lowered_budget_blocks_creates_until_units_are_released() -> None:
    t = make_tracker(make_spec(min_count=0, max_count=8), budgets={"cpu": 8})
    add_ready(t, "a")
    add_ready(t, "b")
    t.swap_catalog(make_catalog(make_spec(max_count=8), budgets={"cpu": 2}), 1.0)
    assert t.ledger.headroom("cpu") == 0
    demand = [make_request("alice") for _ in range(3)]
    for req in demand[:2]:
        lease(t, req)
    assert [a for a in t.reconcile(demand[2:], 2.0) if isinstance(a, CreatePod)] == []


# -- the invariant under random load --------------------------------------------------------

_OPS = st.lists(
    st.tuples(
        st.sampled_from(["submit", "pass", "ready", "finish", "gone", "rollout"]),
        st.integers(0, 1000),
    ),
    min_size=40,  # a rollout needs pods made, busy and idle first
    max_size=160,
)


class _Shell:
    """Drives a tracker as the broker does: a queue, passes, pods that start and vanish."""

    def __init__(self, tracker: Tracker) -> None:
        self.t = tracker
        self.now = 0.0
        self.queue: deque = deque()
        self.running: list[str] = []
        self.submitted = self.finished = 0
        self.versions = 1
        self.names = itertools.count()

    def step(self, op: str, pick: int) -> None:
        t = self.t
        self.now += 1.0
        if op == "submit":
            self.queue.append(make_request(f"c{pick % 5}", tag=None))
            self.submitted += 1
        elif op == "pass":
            leases, waiting = t.claim_all(list(self.queue), self.now)
            for got in leases:
                t.launched(got.job_id, self.now)
                self.running.append(got.job_id)
            placed = {got.job_id for got in leases}
            self.queue = deque(r for r in self.queue if r.job_id not in placed)
            for action in t.reconcile(waiting, self.now):
                if isinstance(action, CreatePod):
                    template = t.catalog.pools["cpu"].template
                    name = f"p{next(self.names)}"
                    pod = PodInfo(name=name, sku=action.sku, created=self.now, template=template)
                    t.add_pod(pod, self.now)
        elif op == "ready":
            starting = [p.name for p in t.pods() if p.state is PodState.STARTING]
            if starting:
                t.pod_ready(starting[pick % len(starting)], self.now)
        elif op == "finish" and self.running:
            job = self.running.pop(pick % len(self.running))
            t.release(job, True, self.now)
            self.finished += 1
        elif op == "gone":
            retiring = _retiring(t)
            if retiring:
                t.pod_gone(retiring[pick % len(retiring)], self.now)
        elif op == "rollout":
            self.versions += 1
            t.swap_catalog(_rolled(t, f"v{self.versions}"), self.now)

    def check(self, budget: int, ceiling: int, before: set[str]) -> set[str]:
        """The pool is within its ceiling, and an old-template pod that started retiring
        since ``before`` (the retiring pods then) did so within the drain budget. Returns
        the retiring pods now."""
        pods = [p for p in self.t.pods() if p.state is not PodState.DELETED]
        assert len(pods) <= ceiling, f"{len(pods)} pods past the ceiling {ceiling}"
        current = self.t.catalog.pools["cpu"].template
        retiring = {p.name for p in pods if p.state is PodState.RETIRING}
        rolled = [p.name for p in pods if p.name in retiring - before and p.template != current]
        assert not rolled or len(retiring) <= budget, (
            f"{rolled} retired with {sorted(retiring)} retiring: past the drain budget {budget}"
        )
        return retiring


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=_OPS,
    budget=st.integers(1, 3),
    ceiling=st.integers(2, 6),
    hold=st.sampled_from([0.0, 5.0]),
)
def test_a_rollout_under_load_keeps_the_budget_and_the_ceiling_and_ends_every_job(
    ops: list[tuple[str, int]], budget: int, ceiling: int, hold: float
) -> None:
    # Owner holds end (or are 0) and retire current-template pods meanwhile: those are not
    # the rollout's, and the budget bounds only the rollout's own retirements.
    spec = make_spec(drain_budget=budget, max_count=ceiling, min_count=1, max_idle_count=ceiling,
                     idle_timeout_s=_NEVER, caller_hold_s=hold, hold_min_tenure_s=0.0,
                     tag_mode="hint")  # fmt: skip
    shell = _Shell(make_tracker(spec))
    retiring: set[str] = set()
    for op, pick in ops:
        shell.step(op, pick)
        retiring = shell.check(budget, ceiling, retiring)
    # Then the load stops: every queued and running job ends, and the pool converges on
    # the newest template.
    for _ in range(20 * (ceiling + len(ops))):
        for op in ("pass", "ready", "finish", "gone"):
            shell.step(op, 0)
            retiring = shell.check(budget, ceiling, retiring)
        current = shell.t.catalog.pools["cpu"].template
        done = not shell.queue and not shell.running
        if done and all(p.template == current for p in shell.t.pods()):
            break
    assert (shell.finished, len(shell.queue)) == (shell.submitted, 0)
    current = shell.t.catalog.pools["cpu"].template
    assert all(p.template == current for p in shell.t.pods())
