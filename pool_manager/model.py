"""Plain data the control plane passes around: pods, claim requests, leases and actions.

Every type here is a slotted dataclass with no behaviour beyond trivial properties, so the
tracker, the scaler, the simulator and the broker's shells can exchange them freely. Only
``PodInfo`` is mutable, and only the tracker mutates it, under its lock; everything handed
out of the tracker is a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

from pool_manager.states import PodState

Role = Literal["active", "standby"]
Path = Literal["warm", "recycled", "idle", "standby", "new", "single_use"]

#: Acquisition paths from warmest to coldest; a gang's lease reports the coldest of its pods.
PATH_ORDER: tuple[str, ...] = ("warm", "recycled", "idle", "standby", "new", "single_use")


@dataclass(slots=True)
class PodInfo:
    """What the tracker knows of one pod.

    Invariants kept by the tracker: a used pod (``owner`` set) is claimable only by ``owner``;
    ``released_at`` is when the pod last became idle (ready time for a never-used pod) and
    ``hold_until`` when its owner hold ends; ``job_id`` is set exactly while the pod is
    ASSIGNED or RUNNING. Transitions are recorded in the tracker's bounded log
    (``Tracker.history(name)``), not on the pod: 100,000 of these must stay small.
    """

    name: str
    sku: str
    created: float
    role: str = "active"
    """``active`` or ``standby`` (a zero-VRAM pod sharing ``gpu`` with an active pod)."""
    gpu: str | None = None
    """Physical GPU id this pod is pinned to (GPU pools); ``None`` for CPU pods."""
    template: str = "v1"
    state: PodState = PodState.STARTING
    owner: str | None = None
    """Last caller (owner-only reuse); ``None`` = never used."""
    tag: str | None = None
    queue: str | None = None
    released_at: float | None = None
    hold_until: float | None = None
    single_use: bool = False
    job_id: str | None = None
    retire_after: bool = False
    """Run the current job, then retire (session boundary crossed: the ``recycled`` path)."""


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """One queued job asking for ``pods`` pods of ``sku``."""

    job_id: str
    caller: str
    sku: str
    lease_tag: str | None
    queue: str = "default"
    pods: int = 1
    single_use: bool = False
    queued_at: float = 0.0
    priority: int = 0
    """Higher first; the queue is in (priority, age) order. A job that missed for want of
    pods is not overtaken in its pool by jobs of lower priority (``dispatch_pass``)."""


class Lease(NamedTuple):
    """A successful claim: every pod of the job, how they were acquired and why not warmer.

    A ``NamedTuple`` rather than a frozen dataclass: just as immutable, and built in a third
    of the time on the claim path (a frozen dataclass pays ``object.__setattr__`` per field).
    """

    job_id: str
    pods: tuple[str, ...]
    path: str
    """One of ``PATH_ORDER``; for a gang, the coldest path among its pods."""
    reason: str | None
    """Why no warmer path was used; ``None`` for ``warm``."""


@dataclass(frozen=True, slots=True)
class Miss:
    """No placement now; the job stays queued and counts as demand."""

    reason: str
    """``unknown_sku``, ``no_idle_pod``, ``gang_unplaceable``, ``caller_pod_limit``,
    ``caller_gpu_limit`` or ``own_pod_resetting`` (the session's own pod is held for it once
    its reset, in progress, reports clean: it waits, and is no demand)."""


class PodRelease(NamedTuple):
    """One pod after its job ended: kept (held for its owner) or to be deleted, and why.

    ``reason``: ``held``, ``unclean_reset``, ``session_boundary``, ``single_use``,
    ``stale_template`` or ``no_owner_hold``. A ``NamedTuple`` for the same reason as ``Lease``.
    """

    name: str
    retire: bool
    reason: str


@dataclass(frozen=True, slots=True)
class CreatePod:
    """Ask the backend for a pod. ``gpu`` pins a standby to an existing active's card."""

    sku: str
    role: str = "active"
    gpu: str | None = None


@dataclass(frozen=True, slots=True)
class DeletePod:
    name: str
    reason: str


Action = CreatePod | DeletePod
