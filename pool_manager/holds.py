"""Owner holds (paper §4, §5): a used pod waits, idle, for its own caller only.

A hold starts when a job ends clean with no reason to retire its pod (``Tracker.release``
decides, on the release hot path, and lists the reasons): the pod goes back to its caller's
session bucket until ``hold_until = now + hold_s``. No other caller ever sees it (the owner
is part of the bucket key). The hold ends when:

* its caller's next job of that session takes the pod (``warm``), or a job of another of
  its sessions does rather than wait (``recycled``: that job, then the pod retires);
* it expires (``expire_locked``, every scaler pass): the pod retires, ``hold_expired``;
* the scaler breaks it for queued jobs blocked at the pool's ceiling (``scaler.plan``:
  oldest hold first, past ``hold_min_tenure_s``): the pod retires, ``hold_broken``.

Functions over the ``PodIndex``; those ending in ``_locked`` assume the tracker's lock.
"""

from __future__ import annotations

from collections.abc import Callable

from pool_manager.model import DeletePod, PodInfo
from pool_manager.pod_index import PodIndex


def settle_idle_locked(pod: PodInfo, hold_s: float, now: float) -> None:
    """Fill in the times of a pod found (not made) idle: when it went idle and, for a used
    one, when its owner hold ends (a hold that never ends would never retire)."""
    if pod.released_at is None:
        pod.released_at = now
    if pod.owner is not None and pod.hold_until is None:
        pod.hold_until = pod.released_at + hold_s


def expire_locked(
    index: PodIndex, now: float, keep: Callable[[PodInfo], bool] | None = None
) -> list[DeletePod]:
    """Retire every idle pod whose owner hold ended by ``now`` (parked ones included),
    except those ``keep`` says stay (a rollout's old-template pods past the drain budget:
    the scaler retires them later, within it)."""
    out: list[DeletePod] = []
    for pod in index.expired_holds_locked(now):
        if keep is not None and keep(pod):
            continue
        if index.retire_locked(pod, "hold_expired", now):
            out.append(DeletePod(pod.name, "hold_expired"))
    return out
