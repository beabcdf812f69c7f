"""Owner holds retire when they end (paper §5), however the pod came to be idle and held.

``expire`` walks the holds only once the earliest may have ended (``_next_expiry``); these
check that it still retires exactly the idle owner-held pods whose hold ended, whether the
pod went idle by a release, an undone claim, a gate reopening, an ``add_pod`` of a pod found
idle or a restart, and that a pass before any hold ended changes nothing."""

from __future__ import annotations

import os

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from pool_manager.model import DeletePod
from pool_manager.states import PodState
from pool_manager.tracker import Tracker
from tests.pool_manager.builders import (
    add_ready,
    lease,
    make_pod,
    make_request,
    make_spec,
    make_tracker,
    run_job,
    state_of,
)
from tests.pool_manager.control_plane import ControlPlane


def _ended(t: Tracker, now: float) -> set[str]:
    """The idle pods with an owner whose hold ended by ``now``: what ``expire`` retires."""
    return {
        p.name
        for p in t.pods()
        if p.state is PodState.IDLE
        and p.owner is not None
        and p.hold_until is not None
        and p.hold_until <= now
    }


class HoldExpiry(ControlPlane):
    """The control-plane state machine, plus hold expiry checked against every pod."""

    @rule(dt=st.floats(min_value=0.0, max_value=40.0))
    def expire(self, dt: float) -> None:
        self.now += dt
        due = _ended(self.t, self.now)
        retired = {d.name for d in self.t.expire(self.now) if d.reason == "hold_expired"}
        assert retired == due
        assert not _ended(self.t, self.now)
        self.deleting |= retired


TestHoldExpiry = HoldExpiry.TestCase
TestHoldExpiry.settings = settings(
    max_examples=int(os.environ.get("FIREPOOL_STATEFUL_EXAMPLES", "60")),
    stateful_step_count=80,
    deadline=None,
)


def test_a_hold_ends_on_time_after_an_earlier_one_was_walked() -> None:
    t = make_tracker(make_spec("cpu", caller_hold_s=10), make_spec("cpu2", caller_hold_s=100))
    short, long = add_ready(t, sku="cpu"), add_ready(t, sku="cpu2")
    run_job(t, make_request("alice", "cpu2", tag="a"), now=0.0)  # held until 100
    assert t.expire(5.0) == []  # walks the holds: none ended, the next ends at 100
    run_job(t, make_request("bob", "cpu", tag="b"), now=6.0)  # held until 16: sooner
    assert t.expire(15.9) == []
    assert t.expire(16.0) == [DeletePod(short, "hold_expired")]
    assert t.expire(99.0) == []
    assert t.expire(100.0) == [DeletePod(long, "hold_expired")]


def test_a_claim_undone_after_a_walk_keeps_its_original_hold() -> None:
    t = make_tracker(make_spec(caller_hold_s=10))
    name = add_ready(t)
    run_job(t, make_request("alice", tag="a"), now=0.0)  # held until 10
    req = make_request("alice", tag="a")
    lease(t, req, now=1.0)  # out of its bucket while the next pass walks
    assert t.expire(2.0) == []
    t.unclaim(req.job_id, 3.0)  # idle again, held until 10 as before
    assert t.expire(9.0) == []
    assert t.expire(10.0) == [DeletePod(name, "hold_expired")]


def test_a_pod_found_idle_and_held_retires_when_its_hold_ends() -> None:
    t = make_tracker(make_spec(caller_hold_s=10))
    assert t.expire(1.0) == []
    pod = make_pod(state=PodState.IDLE, owner="alice", tag="a", released_at=0.0)
    t.add_pod(pod, 2.0, reserved=False)
    assert t.expire(9.0) == []
    assert t.expire(10.0) == [DeletePod(pod.name, "hold_expired")]
    assert state_of(t, pod.name) is PodState.RETIRING


def test_a_restart_keeps_every_hold_and_its_end() -> None:
    t = make_tracker(make_spec(caller_hold_s=10))
    name = add_ready(t)
    run_job(t, make_request("alice", tag="a"), now=0.0)
    fresh = Tracker(t.catalog, t.ledger)
    fresh.restore(t.pods(), 1.0)
    assert fresh.expire(9.0) == []
    assert fresh.expire(10.0) == [DeletePod(name, "hold_expired")]


def test_a_parked_hold_retires_when_its_hold_ends() -> None:
    t = make_tracker(make_spec("gpu", caller_hold_s=10, standbys_per_active=1))
    active = add_ready(t, sku="gpu", gpu="G0")
    run_job(t, make_request("alice", "gpu", tag="a"), now=0.0)  # held until 10
    standby = make_pod(sku="gpu", role="standby", gpu="G0")
    t.add_pod(standby, 0.0, reserved=False)
    t.pod_ready(standby.name, 0.0)
    t.mark_gpu_verified("G0", True, 0.0)
    assert t.expire(1.0) == []
    other = make_request("bob", "gpu")
    assert lease(t, other, now=2.0).pods == (standby.name,)  # the gate parks alice's pod
    assert t.expire(9.0) == []
    assert t.expire(10.0) == [DeletePod(active, "hold_expired")]
