"""Which pods a job gets: the claim order and the session boundary (paper §5, A.2, A.3).

Order per SKU, for a reusable job from ``caller`` on ``queue`` with ``tag``:

1. ``warm``: an idle pod ``caller`` last used with the same queue and tag (in ``hint`` tag
   mode, any of the caller's pods on the same queue: the tag only prefers);
2. ``idle``: a never-used idle pod (``new`` if it became ready after the job was queued);
3. ``standby``: a promotable standby (gate open, GPU verified exclusive);
4. ``recycled``: rather than wait for a new pod, one of the caller's own pods from another
   session (a new tag, or another queue): it runs this one job and then retires, so state
   crosses at most one job of the next session;
5. otherwise a miss: the job stays queued and counts as demand (a new pod).

Recycling comes after the never-used and standby pods ("its next job may run once on the
old pod *so it does not wait*", §5): a new session then never evicts a concurrent session's
warm pod while clean capacity is free, and the old session's pod retires at its hold's end.
A used pod is never offered to another caller: the owner is part of every bucket key.
Single-use jobs skip 1 and 4 (a used pod is not clean enough). A gang takes its N pods from
the same sources in the same order, on distinct physical GPUs, or nothing.

``tag_mode: switch`` adds a boundary in time: when a claim switches its caller to a new
session on a queue, the caller's pods held for its other tags there retire (``Sessions``).

The exact warm match is ``PodIndex.lease_warm_locked`` (the hot path); the rest is here.
Decisions over the ``PodIndex``; every function assumes the tracker's lock is held.
"""

from __future__ import annotations

from typing import NamedTuple

from pool_manager.catalog import PoolSpec
from pool_manager.model import PATH_ORDER, ClaimRequest, DeletePod, PodInfo
from pool_manager.pod_index import PodIndex, Session, View

Pick = tuple[PodInfo, str, str | None]
"""A pod, the path it is taken by, and why no warmer path was used."""
_RANK = {path: rank for rank, path in enumerate(PATH_ORDER)}


class Claimed(NamedTuple):
    """Pods leased to a job by ``claim_cold_locked`` or ``claim_many_locked``."""

    pods: tuple[PodInfo, ...]
    path: str
    """The lease's path: the coldest of its pods' (``single_use`` for a single-use job)."""
    reason: str | None
    """Why no warmer path was used (``None`` for ``warm``)."""
    promoted: tuple[str, ...]
    """The standbys among them (``unclaim`` makes them standbys again)."""
    retired: list[DeletePod]
    """Deletes of pods a session switch retired, for the shell."""


def claim_cold_locked(
    index: PodIndex, sessions: Sessions, req: ClaimRequest, spec: PoolSpec, now: float
) -> Claimed | None:
    """Lease a one-pod, reusable job whose session holds no pod, or ``None``."""
    picked = pick_cold_locked(index, req, spec.tag_mode == "hint")
    if picked is None:
        return None
    pod, path, reason = picked
    index.lease_locked(pod, req.job_id, path, now)
    mark_taken_locked(pod, path)
    retired = sessions.end_prior_locked(index, req, now) if spec.tag_mode == "switch" else []
    if pod.gpu is not None:  # after the switch, which finds the caller's pods in buckets
        index.close_gate_locked(pod, pod.gpu)
    return Claimed((pod,), path, reason, (pod.name,) if path == "standby" else (), retired)


def claim_many_locked(
    index: PodIndex, sessions: Sessions, req: ClaimRequest, spec: PoolSpec, now: float
) -> Claimed | None:
    """Lease a gang or single-use job its ``req.pods`` pods on distinct physical GPUs, all
    or nothing (``None``)."""
    picked = pick_many_locked(index, req, spec.tag_mode == "hint")
    if picked is None:
        return None
    coldest, reason = 0, None
    for pod, path, why in picked:
        index.lease_locked(pod, req.job_id, path, now)
        if path != "warm":
            mark_taken_locked(pod, path)
        if req.single_use:
            pod.single_use = True
        if pod.gpu is not None:
            index.close_gate_locked(pod, pod.gpu)
        rank = _RANK[path]
        if rank > coldest or (rank == coldest and reason is None):
            coldest, reason = rank, why
    retired: list[DeletePod] = []
    if spec.tag_mode == "switch" and not req.single_use and coldest > 0:
        retired = sessions.end_prior_locked(index, req, now)
    pods = tuple(pod for pod, _, _ in picked)
    promoted = tuple(pod.name for pod, path, _ in picked if path == "standby")
    if req.single_use:
        return Claimed(pods, "single_use", "single_use_requested", promoted, retired)
    path = PATH_ORDER[coldest]
    return Claimed(pods, path, None if path == "warm" else reason, promoted, retired)


def pick_cold_locked(index: PodIndex, req: ClaimRequest, hint: bool) -> Pick | None:
    """Everything after an exact warm match, for a one-pod, reusable job; the pod picked
    is out of its bucket."""
    sku, caller = req.sku, req.caller
    index.drop_emptied_locked(sku, caller)
    sessions = index.sessions_locked(sku, caller)
    if sessions and hint:
        for session in reversed(sessions):
            if session[0] == req.queue:  # the tag is only a routing hint here
                return index.pop_locked(index.held_locked(sku, caller, session)), "warm", None
    fresh = index.fresh_locked(sku)
    if fresh:
        pod = index.pop_locked(fresh)
        if pod.released_at is not None and pod.released_at > req.queued_at:
            return pod, "new", "no_idle_pod_when_queued"
        if sessions:  # it has idle pods; the session boundary kept it off them
            same_queue = any(queue == req.queue for queue, _ in sessions)
            return pod, "idle", "tag_changed" if same_queue else "queue_changed"
        return pod, "idle", "no_owned_idle_pod"
    standby = index.standbys_locked(sku)
    if standby:
        return index.pop_locked(standby), "standby", "no_idle_pod"
    if sessions:  # rather than wait for a new pod: once on the caller's old one
        session = next(reversed(sessions))
        pod = index.pop_locked(index.held_locked(sku, caller, session))
        return pod, "recycled", "queue_changed" if session[0] != req.queue else "tag_changed"
    return None


def pick_many_locked(index: PodIndex, req: ClaimRequest, hint: bool) -> list[Pick] | None:
    """``req.pods`` pods on distinct physical GPUs, warmest first; ``None`` if fewer. The
    pods stay in their buckets."""
    sku, caller = req.sku, req.caller
    fresh, standby = index.fresh_locked(sku), index.standbys_locked(sku)
    if req.single_use and len(fresh) + len(standby) < req.pods:
        return None  # only never-used pods and standbys serve it: too few, whatever cards
    own: Session = (req.queue, req.lease_tag)
    sources: list[tuple[View[PodInfo], str, str | None]] = []
    recycled: list[tuple[View[PodInfo], str, str | None]] = []
    if not req.single_use:
        sources.append((index.held_locked(sku, caller, own), "warm", None))
        for session in reversed(index.sessions_locked(sku, caller)):
            if session == own:
                continue
            held = index.held_locked(sku, caller, session)
            if session[0] == req.queue and hint:
                sources.append((held, "warm", None))
            else:
                boundary = "tag_changed" if session[0] == req.queue else "queue_changed"
                recycled.append((held, "recycled", boundary))
    sources.append((fresh, "idle", "no_owned_idle_pod"))
    sources.append((standby, "standby", "no_idle_pod"))
    sources.extend(recycled)
    chosen: list[Pick] = []
    cards: set[str] = set()
    for pods, path, why in sources:
        for pod in reversed(pods):
            if pod.gpu is not None:
                if pod.gpu in cards:
                    continue
                cards.add(pod.gpu)
            if path == "idle" and (pod.released_at or 0.0) > req.queued_at:
                chosen.append((pod, "new", "no_idle_pod_when_queued"))
            else:
                chosen.append((pod, path, why))
            if len(chosen) == req.pods:
                return chosen
    return None


def mark_taken_locked(pod: PodInfo, path: str) -> None:
    """What taking ``pod`` by ``path`` commits it to."""
    if path == "recycled":
        pod.retire_after = True  # across a session boundary: this job, then retire
    elif path == "standby":
        pod.role = "active"  # promoted: it holds the card now


class Sessions:
    """``tag_mode: switch``: each caller's live session (lease tag) per pool and queue, set
    when one of its claims switches to it."""

    __slots__ = ("_live",)

    def __init__(self) -> None:
        self._live: dict[tuple[str, str, str], str | None] = {}

    def clear_locked(self) -> None:
        self._live.clear()

    def left_locked(self, req: ClaimRequest) -> bool:
        """Whether ``req``'s caller switched away from ``req``'s session since. Its pod then
        retires at release: held for the old tag, a later job of the new session would
        recycle it and run on the old session's pod."""
        return self._live.get((req.sku, req.caller, req.queue), req.lease_tag) != req.lease_tag

    def end_prior_locked(self, index: PodIndex, req: ClaimRequest, now: float) -> list[DeletePod]:
        """``req`` switched its caller to its session on ``req.queue`` (paper §5: "when a
        caller switches to a new session ... the prior pod is retired"). The caller's idle
        pods held for any other tag on that queue retire now, those parked behind a closed
        GPU gate included, so a session's state reaches at most the one job that recycled
        its pod; pods busy with another tag's job retire at release (``left_locked``). Pods
        on other queues keep their holds. Returns the deletes for the shell."""
        sku, caller = req.sku, req.caller
        prior = [
            session
            for session in index.sessions_locked(sku, caller)
            if session[0] == req.queue and session[1] != req.lease_tag
        ]
        ended: list[PodInfo] = []
        for session in prior:
            ended.extend(index.held_locked(sku, caller, session))
        if index.gates:
            ended.extend(
                pod
                for pod in index.parked_locked()
                if pod.owner == caller and pod.sku == sku and pod.queue == req.queue
                and pod.tag != req.lease_tag
            )  # fmt: skip
        retired = [
            DeletePod(pod.name, "session_switched")
            for pod in ended
            if index.retire_locked(pod, "session_switched", now)
        ]
        self._live[(sku, caller, req.queue)] = req.lease_tag
        return retired
