"""The pod tracker: every pod by name, SKU, owner and job, behind one lock (paper §3, A.1).

Claim, launch, unclaim and release are each one step under ``_lock``: finding eligible pods,
checking per-caller limits, validating the transitions and recording the lease happen
together, so no two dispatchers claim the same pod or overrun a limit. Nothing inside the lock
does I/O, logs, sleeps or reads a clock: time is passed in (``now``), which is what lets the
simulator and the property tests drive this exact code.

Claim buckets hold only pods claimable *right now* (``IDLE``, GPU gate open, and for a standby
a verified-exclusive GPU), so every lookup is O(1):

* ``_exact[(sku, owner, queue, tag)]`` and ``_owned[(sku, owner)]``: used pods held for
  their owner (owner-only reuse; ``_exact`` is a subset of ``_owned``);
* ``_fresh[sku]``: never-used idle pods; ``_standby[sku]``: promotable standbys.

Each bucket is a dict used as an insertion-ordered set; the most recently idled pod is taken
first (warmest page cache; older holds are the ones left to expire).

Concurrency rule: public methods take ``_lock``; helpers ending in ``_locked`` assume it is
held. ``reconcile`` additionally serialises scaler passes with ``_reconcile_lock`` (never
taken while ``_lock`` is held), so two passes never plan the same create or delete.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from pool_manager.budgets import BudgetLedger
from pool_manager.catalog import Catalog, PoolSpec
from pool_manager.model import (
    PATH_ORDER,
    Action,
    ClaimRequest,
    CreatePod,
    DeletePod,
    Lease,
    Miss,
    PodInfo,
    PodRelease,
)
from pool_manager.pod_index import Bucket, LiveJob, PodIndex
from pool_manager.scaler import plan
from pool_manager.snapshot import PoolSnapshot, build_snapshot
from pool_manager.states import (
    POD_HISTORY_LIMIT,
    POD_TRANSITIONS,
    IllegalTransition,
    PodState,
    transition,
)

_IDLE = PodState.IDLE
_ASSIGNED = PodState.ASSIGNED
_RUNNING = PodState.RUNNING
_RETIRING = PodState.RETIRING
_T = POD_TRANSITIONS
_H = POD_HISTORY_LIMIT


class Tracker(PodIndex):
    """In-memory pod index and the claim policy. See the module docstring for the rules."""

    def __init__(
        self,
        catalog: Catalog,
        ledger: BudgetLedger | None = None,
        *,
        lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        super().__init__(catalog, ledger if ledger is not None else BudgetLedger(catalog.budgets))
        self._lock: AbstractContextManager[Any] = lock if lock is not None else threading.Lock()
        self._reconcile_lock = threading.Lock()

    # -- pods appear, become ready, vanish -------------------------------------------------
    def add_pod(self, pod: PodInfo, now: float, *, reserved: bool = True) -> None:
        """Track a pod the shell just asked the backend for (normally ``STARTING``).

        The tracker takes ownership of ``pod``. ``reserved``: the scaler already reserved the
        pod's budget units (every ``CreatePod`` it returns); pass ``False`` for a pod found
        outside a plan, whose units are then recorded even past the budget.
        """
        with self._lock:
            if pod.name in self._pods:
                raise ValueError(f"pod {pod.name!r} is already tracked")
            if pod.sku not in self._specs:
                raise ValueError(f"pod {pod.name!r} has unknown sku {pod.sku!r}")
            if pod.state is not PodState.STARTING and pod.state is not _IDLE:
                raise ValueError("add_pod takes STARTING or IDLE pods; use restore() for others")
            self._pods[pod.name] = pod
            self._join_group_locked(pod, reserved=reserved)
            if pod.state is _IDLE:
                if pod.owner is None and pod.released_at is None:
                    pod.released_at = now
                self._index_locked(pod)

    def pod_ready(self, name: str, now: float, gpu: str | None = None) -> None:
        """STARTING -> IDLE: the agent answered. ``gpu``: the card the backend placed it on,
        when it was not known at create time."""
        with self._lock:
            pod = self._pods.get(name)
            if pod is None or pod.state is not PodState.STARTING:
                return  # deleted or retired while starting: nothing to do
            if gpu is not None and pod.gpu is None:
                self._leave_group_locked(pod, release=False)
                pod.gpu = gpu
                self._join_group_locked(pod, reserved=True, moved=True)
            transition(pod, _IDLE, "ready", now, _T, _H)
            if pod.owner is None:
                pod.released_at = now
            self._index_locked(pod)

    def pod_gone(self, name: str, now: float) -> str | None:
        """The pod vanished or its delete completed (or its create failed): forget it, release
        its budget when its group empties, open its GPU gate. Returns the job it ran, if any;
        that job's other pods stay leased until ``release``."""
        with self._lock:
            pod = self._pods.pop(name, None)
            if pod is None:
                return None
            if pod.state is _IDLE:
                self._unindex_locked(pod)
            job_id = pod.job_id
            if job_id is not None:
                job = self._jobs.get(job_id)
                if job is not None:
                    self._uncount_locked(job, 1)
            transition(pod, PodState.DELETED, "gone", now, _T, _H)
            self._leave_group_locked(pod, release=True)
            return job_id

    # -- claim -----------------------------------------------------------------------------
    def claim(self, req: ClaimRequest, now: float) -> Lease | Miss:
        """All of ``req.pods`` pods in one step, or nothing (a ``Miss`` saying why).

        Order per SKU: the caller's own held pod (same queue and tag: ``warm``; across a
        session boundary: ``recycled``, retires after the job) -> a never-used idle pod
        (``idle``, or ``new`` if it became ready after the job was queued) -> a promotable
        standby (``standby``) -> miss. Single-use jobs take only never-used pods.
        """
        with self._lock:
            return self._claim_locked(req, now)

    def claim_all(
        self, requests: Iterable[ClaimRequest], now: float
    ) -> tuple[list[Lease], list[ClaimRequest]]:
        """Claim in the given (priority) order. A job that cannot be placed is skipped, never
        partially held, so smaller jobs behind it proceed; the skipped ones are the demand."""
        leases: list[Lease] = []
        demand: list[ClaimRequest] = []
        for req in requests:
            got = self.claim(req, now)
            if isinstance(got, Lease):
                leases.append(got)
            else:
                demand.append(req)
        return leases, demand

    def _claim_locked(self, req: ClaimRequest, now: float) -> Lease | Miss:
        spec = self._specs.get(req.sku)
        if spec is None:
            return Miss("unknown_sku")
        if self._limited:
            over = self._over_limit_locked(req, spec)
            if over is not None:
                return Miss(over)
        if req.pods != 1 or req.single_use:
            return self._claim_many_locked(req, spec, now)
        caller = req.caller
        sku = req.sku
        bucket = self._exact.get((sku, caller, req.queue, req.lease_tag))
        if bucket:
            pod = self._pods[next(reversed(bucket))]
            path = "warm"
            reason: str | None = None
        else:
            picked = self._pick_cold_locked(req, spec)
            if picked is None:
                return Miss("no_idle_pod")
            pod, path, reason = picked
        self._take_locked(pod, req, path, now)
        gpus = spec.units_per_pod if spec.accelerator != "cpu" else 0
        promoted = (pod.name,) if path == "standby" else ()
        self._jobs[req.job_id] = LiveJob(req, (pod.name,), promoted, gpus)
        if self._limited:
            self._count_locked(caller, 1, gpus)
        return Lease(req.job_id, (pod.name,), path, reason)

    def _pick_cold_locked(
        self, req: ClaimRequest, spec: PoolSpec
    ) -> tuple[PodInfo, str, str | None] | None:
        """Everything after an exact warm match, for a one-pod, reusable job."""
        owned = self._owned.get((req.sku, req.caller))
        if owned:
            if spec.tag_mode == "hint":
                for name in reversed(owned):
                    pod = self._pods[name]
                    if pod.queue == req.queue:
                        return pod, "warm", None  # the tag is only a routing hint here
            pod = self._pods[next(reversed(owned))]
            why = "queue_changed" if pod.queue != req.queue else "tag_changed"
            return pod, "recycled", why
        fresh = self._fresh.get(req.sku)
        if fresh:
            pod = self._pods[next(reversed(fresh))]
            if pod.released_at is not None and pod.released_at > req.queued_at:
                return pod, "new", "no_idle_pod_when_queued"
            return pod, "idle", "no_owned_idle_pod"
        standby = self._standby.get(req.sku)
        if standby:
            return self._pods[next(reversed(standby))], "standby", "no_idle_pod"
        return None

    def _claim_many_locked(self, req: ClaimRequest, spec: PoolSpec, now: float) -> Lease | Miss:
        """Gangs and single-use jobs: N pods on distinct physical GPUs, all or nothing."""
        picked = self._pick_many_locked(req)
        if picked is None:
            return Miss("gang_unplaceable" if req.pods > 1 else "no_idle_pod")
        names: list[str] = []
        promoted: list[str] = []
        coldest = 0
        reason: str | None = None
        for pod, path, why in picked:
            self._take_locked(pod, req, path, now)
            names.append(pod.name)
            if path == "standby":
                promoted.append(pod.name)
            rank = PATH_ORDER.index(path)
            if rank > coldest or (rank == coldest and reason is None):
                coldest, reason = rank, why
        path = "single_use" if req.single_use else PATH_ORDER[coldest]
        if req.single_use:
            reason = "single_use_requested"
        gpus = spec.units_per_pod if spec.accelerator != "cpu" else 0
        job = LiveJob(req, tuple(names), tuple(promoted), gpus)
        self._jobs[req.job_id] = job
        if self._limited:
            self._count_locked(req.caller, len(names), gpus * len(names))
        return Lease(req.job_id, job.pods, path, None if path == "warm" else reason)

    def _pick_many_locked(self, req: ClaimRequest) -> list[tuple[PodInfo, str, str | None]] | None:
        want = req.pods
        chosen: list[tuple[PodInfo, str, str | None]] = []
        seen: set[str] = set()
        cards: set[str] = set()
        sources: list[tuple[Bucket | None, str, str | None]] = []
        if not req.single_use:
            exact = self._exact.get((req.sku, req.caller, req.queue, req.lease_tag))
            sources.append((exact, "warm", None))
            sources.append((self._owned.get((req.sku, req.caller)), "recycled", "tag_changed"))
        sources.append((self._fresh.get(req.sku), "idle", "no_owned_idle_pod"))
        sources.append((self._standby.get(req.sku), "standby", "no_idle_pod"))
        hint = self._specs[req.sku].tag_mode == "hint"
        for bucket, path, why in sources:
            if not bucket:
                continue
            for name in reversed(bucket):
                if name in seen:
                    continue
                pod = self._pods[name]
                if pod.gpu is not None:
                    if pod.gpu in cards:
                        continue
                    cards.add(pod.gpu)
                seen.add(name)
                p, w = path, why
                if path == "recycled":
                    if pod.queue != req.queue:
                        w = "queue_changed"
                    elif hint:
                        p, w = "warm", None
                elif path == "idle" and (pod.released_at or 0.0) > req.queued_at:
                    p, w = "new", "no_idle_pod_when_queued"
                chosen.append((pod, p, w))
                if len(chosen) == want:
                    return chosen
        return None

    def _take_locked(self, pod: PodInfo, req: ClaimRequest, path: str, now: float) -> None:
        """Move one claimable pod to ASSIGNED for ``req`` and close its GPU's gate."""
        self._unindex_locked(pod)
        transition(pod, _ASSIGNED, path, now, _T, _H)
        pod.job_id = req.job_id
        if path == "recycled":
            pod.retire_after = True
        elif path == "standby":
            pod.role = "active"
        if req.single_use:
            pod.single_use = True
        gpu = pod.gpu
        if gpu is not None:
            group = self._groups[gpu]
            group.gate = pod.name
            for other in group.pods:  # park the rest of the group: one job per GPU
                if other != pod.name:
                    peer = self._pods[other]
                    if peer.state is _IDLE:
                        self._unindex_locked(peer)

    # -- after the claim -------------------------------------------------------------------
    def launched(self, job_id: str, now: float) -> None:
        """ASSIGNED -> RUNNING once the durable commit succeeded. The pod now records its
        caller, queue and tag (what the shell persists as ownership annotations)."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                return
            for name in job.pods:
                pod = self._pods.get(name)
                if pod is not None and pod.job_id == job_id and pod.state is _ASSIGNED:
                    transition(pod, _RUNNING, "launched", now, _T, _H)
                    pod.owner, pod.queue, pod.tag = job.caller, job.queue, job.tag

    def unclaim(self, job_id: str, now: float) -> None:
        """The durable commit failed: every pod goes back exactly as it was (same owner, tag,
        hold and role; a promoted standby is a standby again). Only before ``launched``."""
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is None:
                return
            for name in job.pods:
                pod = self._pods.get(name)
                if pod is None or pod.job_id != job_id:
                    continue
                if pod.state is not _ASSIGNED:
                    raise IllegalTransition(f"unclaim of {job_id}: pod {name} is {pod.state}")
                self._uncount_locked(job, 1)
                transition(pod, _IDLE, "unclaimed", now, _T, _H)
                pod.job_id = None
                pod.retire_after = False
                pod.single_use = False
                if name in job.promoted:
                    pod.role = "standby"
                self._open_gate_locked(pod)
                self._index_locked(pod)

    def release(self, job_id: str, clean: bool, now: float) -> list[PodRelease]:
        """The job ended and each pod's reset reported ``clean`` (processes verified dead,
        scratch wiped) or not. Clean and no boundary: IDLE, held for the caller until
        ``now + hold_s``. Otherwise the pod retires (RETIRING; the shell deletes it, then
        calls ``pod_gone``). A clean reset opens the GPU gate; an unclean one keeps it closed
        until the pod is gone."""
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is None:
                return []
            spec = self._specs[job.sku]
            hold = spec.hold_s
            out: list[PodRelease] = []
            for name in job.pods:
                pod = self._pods.get(name)
                if pod is None or pod.job_id != job_id:
                    continue
                self._uncount_locked(job, 1)
                pod.job_id = None
                if not clean:
                    why = "unclean_reset"
                elif pod.retire_after:
                    why = "session_boundary"
                elif pod.single_use:
                    why = "single_use"
                elif pod.template != spec.template:
                    why = "stale_template"
                elif hold <= 0:
                    why = "no_owner_hold"
                else:
                    pod.owner, pod.queue, pod.tag = job.caller, job.queue, job.tag
                    pod.released_at = now
                    pod.hold_until = now + hold
                    transition(pod, _IDLE, "released", now, _T, _H)
                    self._open_gate_locked(pod)
                    self._index_locked(pod)
                    out.append(PodRelease(name, False, "held"))
                    continue
                pod.owner, pod.queue, pod.tag = job.caller, job.queue, job.tag
                transition(pod, _RETIRING, why, now, _T, _H)
                if clean:
                    self._open_gate_locked(pod)
                out.append(PodRelease(name, True, why))
            return out

    # -- retirement ------------------------------------------------------------------------
    def expire(self, now: float) -> list[DeletePod]:
        """Owner holds past ``hold_until`` retire (never handed to anyone else)."""
        out: list[DeletePod] = []
        with self._lock:
            expired = [
                pod
                for bucket in self._owned.values()
                for pod in map(self._pods.__getitem__, bucket)
                if pod.hold_until is not None and pod.hold_until <= now
            ]
            for group in self._groups.values():
                if group.gate is None:
                    continue
                for name in group.pods:  # parked holds behind a closed gate expire too
                    pod = self._pods[name]
                    if (
                        pod.state is _IDLE
                        and pod.owner is not None
                        and pod.hold_until is not None
                        and pod.hold_until <= now
                    ):
                        expired.append(pod)
            for pod in expired:
                if self._retire_locked(pod, "hold_expired", now):
                    out.append(DeletePod(pod.name, "hold_expired"))
        return out

    def retire(self, name: str, reason: str, now: float) -> bool:
        """Mark an unleased pod RETIRING before the shell deletes it, so it is never claimed
        and no later pass deletes it again. ``False`` if it is leased, retiring or gone."""
        with self._lock:
            pod = self._pods.get(name)
            return pod is not None and self._retire_locked(pod, reason, now)

    def _retire_locked(self, pod: PodInfo, reason: str, now: float) -> bool:
        if pod.state is _IDLE:
            self._unindex_locked(pod)
        elif pod.state is not PodState.STARTING:
            return False
        transition(pod, _RETIRING, reason, now, _T, _H)
        return True

    def reconcile(self, demand: Sequence[ClaimRequest], now: float) -> list[Action]:
        """One scaler pass: expire holds, plan on a snapshot, and mark every planned delete
        RETIRING (dropping deletes of pods claimed meanwhile). The shell then executes the
        returned actions: ``add_pod`` for each create before the next pass, then the backend
        call; the backend delete, then ``pod_gone``."""
        with self._reconcile_lock:
            actions: list[Action] = list(self.expire(now))
            for action in plan(self.snapshot(now), demand, now, self.ledger):
                if isinstance(action, CreatePod) or self.retire(action.name, action.reason, now):
                    actions.append(action)
            return actions

    # -- restart and the exclusivity sweep -------------------------------------------------
    def restore(self, pods: Iterable[PodInfo], now: float) -> list[DeletePod]:
        """Rebuild everything from the backend's pods after a restart (paper A.1).

        Pod fields come from labels and annotations: state, GPU, role, owner, tag, queue,
        release time and hold, and ``job_id`` for pods bound to a RUNNING job (the recovery
        then re-attaches, releases or unclaims those jobs). The ledger is rebuilt with one
        reservation per group. Every GPU starts unverified: no standby promotion until
        ``mark_gpu_verified``. A retiring pod keeps its GPU's gate closed until it is gone.
        Returns deletes for pods the catalog no longer knows.
        """
        orphans: list[DeletePod] = []
        with self._lock:
            self._clear_locked()
            self.ledger.clear()
            jobs: dict[str, list[PodInfo]] = {}
            kept: list[PodInfo] = []
            for src in pods:
                if src.sku not in self._specs or src.name in self._pods:
                    orphans.append(DeletePod(src.name, "unknown_pod"))
                    continue
                pod = replace(src, history=list(src.history))
                if pod.state is PodState.DELETED:
                    continue
                if pod.state is _ASSIGNED or pod.state is _RUNNING:
                    if pod.job_id is None:
                        transition(pod, _RETIRING, "restored_without_job", now, _T, _H)
                    else:
                        jobs.setdefault(pod.job_id, []).append(pod)
                else:
                    pod.job_id = None
                self._pods[pod.name] = pod
                self._join_group_locked(pod, reserved=False)
                kept.append(pod)
            for job_id, members in jobs.items():
                first = members[0]
                spec = self._specs[first.sku]
                req = ClaimRequest(
                    job_id,
                    first.owner or "",
                    first.sku,
                    first.tag,
                    first.queue or "default",
                    len(members),
                )
                gpus = spec.units_per_pod if spec.accelerator != "cpu" else 0
                job = LiveJob(req, tuple(p.name for p in members), (), gpus)
                self._jobs[job_id] = job
                if self._limited:
                    self._count_locked(job.caller, len(members), gpus * len(members))
            for pod in kept:
                if pod.state is _IDLE:
                    if pod.owner is None and pod.released_at is None:
                        pod.released_at = now
                    self._index_locked(pod)
        return orphans

    def mark_gpu_verified(self, gpu: str, exclusive: bool, now: float) -> None:
        """The sweep read the card's usage: ``exclusive`` iff every share on it belongs to this
        group (a card missing from the report is not exclusive). A failed read must not call
        this at all: it changes nothing that tick."""
        with self._lock:
            self._exclusive[gpu] = exclusive
            group = self._groups.get(gpu)
            if group is None:
                return
            for name in group.pods:
                pod = self._pods[name]
                if pod.state is _IDLE and pod.role == "standby":
                    if exclusive:
                        self._index_locked(pod)
                    else:
                        self._unindex_locked(pod)

    # -- views -----------------------------------------------------------------------------
    def get(self, name: str) -> PodInfo | None:
        with self._lock:
            pod = self._pods.get(name)
            return None if pod is None else replace(pod, history=list(pod.history))

    def pods(self) -> list[PodInfo]:
        """Copies of every pod, for /v1/pools and persistence."""
        with self._lock:
            return [replace(p, history=list(p.history)) for p in self._pods.values()]

    def lease_of(self, job_id: str) -> tuple[str, ...] | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else job.pods

    def snapshot(self, now: float) -> PoolSnapshot:
        with self._lock:
            return build_snapshot(self._pods.values(), self._specs, now)

    def gpu_verified(self, gpu: str) -> bool:
        with self._lock:
            return self._exclusive.get(gpu, False)
