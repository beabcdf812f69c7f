"""Owner holds (paper §4, §5): what a released pod becomes, and when a hold ends.

When a job ends, each of its pods is either *held* (idle, claimable by the same caller only,
in its session's bucket, until ``now + hold_s``) or retired, for the first of these reasons:

``unclean_reset``     the agent's reset could not verify the job's processes dead
``session_boundary``  the pod crossed a session boundary for this job (``recycled``), or the
                      caller has switched sessions since (``tag_mode: switch``)
``single_use``        it ran a single-use job
``stale_template``    its pool moved to another template
``no_owner_hold``     the pool holds no pod for its owner (``hold_s`` 0)

A hold that ends retires the pod: it is never handed to another caller (owner-only reuse).
Holds end early only when the scaler breaks them (``scaler.plan``, ``hold_broken``).

Pure decisions over the ``PodIndex``; the functions ending in ``_locked`` assume the
tracker's lock is held.
"""

from __future__ import annotations

from pool_manager.catalog import PoolSpec
from pool_manager.model import DeletePod, PodInfo
from pool_manager.pod_index import PodIndex


def release_verdict(
    pod: PodInfo, spec: PoolSpec, hold_s: float, clean: bool, left_session: bool
) -> str | None:
    """Why ``pod`` retires now that its job ended, or ``None``: it is held for its owner.
    ``left_session``: the job's caller switched away from the job's session."""
    if not clean:
        return "unclean_reset"
    if pod.retire_after or left_session:
        return "session_boundary"
    if pod.single_use:
        return "single_use"
    if pod.template != spec.template:
        return "stale_template"
    if hold_s <= 0:
        return "no_owner_hold"
    return None


def settle_idle(pod: PodInfo, hold_s: float, now: float) -> None:
    """Fill in the times of a pod found (not made) idle: when it went idle and, for a used
    one, when its owner hold ends (a hold that never ends would never retire)."""
    if pod.released_at is None:
        pod.released_at = now
    if pod.owner is not None and pod.hold_until is None:
        pod.hold_until = pod.released_at + hold_s


def expire_locked(index: PodIndex, now: float) -> list[DeletePod]:
    """Retire every idle pod whose owner hold ended by ``now``, parked ones included."""
    out: list[DeletePod] = []
    for pod in index.expired_holds_locked(now):
        if index.retire_locked(pod, "hold_expired", now):
            out.append(DeletePod(pod.name, "hold_expired"))
    return out
