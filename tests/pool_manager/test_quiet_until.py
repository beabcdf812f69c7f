"""``Tracker.quiet_until``: how long a scaler pass with no demand stays a no-op."""

from __future__ import annotations

import math

from pool_manager.model import DeletePod
from pool_manager.tracker import Tracker
from tests.pool_manager.builders import add_ready, make_request, make_spec, make_tracker, run_job


def _pool() -> Tracker:
    """One never-used idle pod (keep-alive ends at 100) and one held for alice (until 60)."""
    t = make_tracker(make_spec(idle_timeout_s=100.0, caller_hold_s=50.0, max_idle_count=0))
    add_ready(t, "fresh", now=0.0)
    add_ready(t, "used", now=0.0)
    run_job(t, make_request("alice"), now=10.0)  # takes "used", the most recently idled
    return t


def _deleted(actions: list[object]) -> list[tuple[str, str]]:
    return [(a.name, a.reason) for a in actions if isinstance(a, DeletePod)]


def test_a_pass_without_demand_changes_nothing_before_the_first_expiry() -> None:
    t = _pool()
    used = t.get("used")
    assert used is not None and used.owner == "alice"
    assert t.reconcile([], 20.0) == []
    held_until = t.quiet_until(20.0)
    assert held_until == 60.0  # alice's hold ends first
    for now in (20.0, 40.0, 59.999):
        assert _pool().reconcile([], now) == []
    assert [why for _, why in _deleted(t.reconcile([], held_until))] == ["hold_expired"]


def test_the_next_keep_alive_to_pass_bounds_it_once_the_holds_are_gone() -> None:
    t = _pool()
    t.reconcile([], 60.0)  # alice's hold expires
    assert t.reconcile([], 61.0) == []
    keep_alive = t.quiet_until(61.0)
    assert keep_alive == 100.0  # the never-used pod became idle at 0
    assert t.reconcile([], 99.999) == []
    assert [why for _, why in _deleted(t.reconcile([], keep_alive))] == ["scale_down"]


def test_an_idle_pool_kept_by_its_idle_cap_is_quiet_forever() -> None:
    t = make_tracker(make_spec(idle_timeout_s=100.0, max_idle_count=2))
    add_ready(t, now=0.0)
    assert t.reconcile([], 200.0) == []  # past its keep-alive, kept by the idle cap
    assert math.isinf(t.quiet_until(200.0))
