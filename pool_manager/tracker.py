"""The pod tracker: every pod by name, SKU, owner and job, behind one lock (paper §3, A.1).

``Tracker`` is the one public facade of the pod state. Under its lock it leases pods to jobs
(the lease table is its own) and runs the policies over the state objects:

* ``PodIndex`` (``pod_index``): pods, claim buckets, GPU cards and gates, the transition log;
* ``CallerUsage`` (``caller_usage``): per-caller limits; ``Sessions`` (``claim_policy``):
  each caller's live session in ``switch`` pools;
* the policies: claim order and session boundaries (``claim_policy``), groups and the GPU
  gate (``gpu_gate``), owner holds (``holds``; the release rules are ``release``'s own, on
  the hot path), restart (``recovery``), and the scaler's snapshot (``snapshot``).

Each public method is one step under ``_lock``: finding eligible pods, checking per-caller
limits, validating the transitions and recording the lease happen together, so no two
dispatchers claim the same pod or overrun a limit. Nothing inside the lock does I/O, logs,
sleeps or reads a clock: time is passed in (``now``), which is what lets the simulator and
the property tests drive this exact code.

Lifecycle of a pod, from the shell's side: ``add_pod`` (STARTING, right after a create is
planned) -> ``pod_ready`` (IDLE) -> ``claim`` (ASSIGNED) -> ``launched`` (RUNNING) ->
``release`` (IDLE held for its owner, or RETIRING) -> ... -> the shell deletes a RETIRING pod
-> ``pod_gone``. ``unclaim`` undoes a claim whose durable commit failed.

Concurrency rule: public methods take ``_lock``; helpers ending in ``_locked`` (here and in
the state and policy modules) assume it is held. ``reconcile`` also serialises scaler passes
with ``_reconcile_lock`` (never taken while ``_lock`` is held), so two passes never plan the
same create or delete.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import fields, replace
from operator import attrgetter
from typing import Any

from pool_manager.budgets import BudgetLedger
from pool_manager.caller_usage import CallerUsage
from pool_manager.catalog import Catalog, PoolSpec
from pool_manager.catalog_change import CatalogChangeRefused
from pool_manager.claim_policy import Sessions, claim_cold_locked, claim_many_locked
from pool_manager.claim_queue import Demand
from pool_manager.gpu_gate import join_group_locked, leave_group_locked, may_stage_standby_locked
from pool_manager.holds import expire_locked, settle_idle_locked
from pool_manager.model import (
    Action,
    ClaimRequest,
    CreatePod,
    DeletePod,
    Lease,
    Miss,
    PodInfo,
    PodRelease,
)
from pool_manager.pod_index import PodIndex, gpus_per_pod
from pool_manager.recovery import LeaseRecord, restore_locked
from pool_manager.scaler import next_keepalive_expiry, plan
from pool_manager.snapshot import PoolSnapshot, build_snapshot, row_of
from pool_manager.states import IllegalTransition, PodState

_IDLE, _ASSIGNED, _DELETED = PodState.IDLE, PodState.ASSIGNED, PodState.DELETED
_RETIRING = PodState.RETIRING
_pod_fields = attrgetter(*(f.name for f in fields(PodInfo)))
_name = attrgetter("name")
_new_lease = _new_release = tuple.__new__  # NamedTuple construction without the Python shim

Session = tuple[str, str, str, str | None]
"""``(sku, caller, queue, tag)``: whose held pods a warm claim takes (``PodIndex``'s bucket)."""


def _session(req: ClaimRequest) -> Session:
    return (req.sku, req.caller, req.queue, req.lease_tag)


_MISSES = {
    r: Miss(r)
    for r in ("unknown_sku", "no_idle_pod", "gang_unplaceable", "caller_pod_limit",
              "caller_gpu_limit", "own_pod_resetting")
}  # fmt: skip


def _breaks_one_of(action: Action, holds: frozenset[str]) -> bool:
    return isinstance(action, DeletePod) and action.reason == "hold_broken" and action.name in holds


RESTORED_HOLD_GRACE_S = 10.0
"""After ``restore``, how long the scaler breaks none of the holds it restored. A restart
answers every caller 503 or nothing for a moment, and its first pass sees at once the queued
jobs recovery put back, before the dispatcher has placed them on their owners' held pods and
before the owners' retried requests are back: a hold it broke then would be one the broker
running on would have kept."""


class Tracker:
    """Pods and their leases behind one lock. See the module docstring."""

    def __init__(
        self,
        catalog: Catalog,
        ledger: BudgetLedger | None = None,
        *,
        lock: AbstractContextManager[Any] | None = None,
        history: int = 16384,
    ) -> None:
        """``ledger``: the per-accelerator ledger the scaler reserves in and ``pod_gone``
        releases to; pass the broker's one ledger (default: a new one from the catalog).
        ``lock``: the one lock (the single-threaded simulator passes a no-op one).
        ``history``: pod transitions kept in ``log`` (all pods together)."""
        self.catalog = catalog
        self.ledger = ledger if ledger is not None else BudgetLedger(catalog.budgets)
        self._lock: AbstractContextManager[Any] = lock if lock is not None else threading.Lock()
        self._reconcile_lock = threading.Lock()
        self._holds_kept_until = float("-inf")
        """Before this time (``restore``'s plus ``RESTORED_HOLD_GRACE_S``) no pod of
        ``_restored_holds`` has its hold broken."""
        self._restored_holds: frozenset[str] = frozenset()
        """The pods ``restore`` found with an owner."""
        self._specs: dict[str, PoolSpec] = dict(catalog.pools)
        self._departed: dict[str, PoolSpec] = {}
        """Pools a catalog swap removed, by name: what ``pod_gone`` releases their last
        (retiring) pods by. Never planned for, never claimed."""
        self._release_terms = {
            sku: (spec, spec.hold_s, spec.tag_mode == "switch") for sku, spec in self._specs.items()
        }
        """Per pool, what ``release`` reads: the spec, the owner hold, whether it switches."""
        self._limited = catalog.has_limits
        self._index = PodIndex(history)
        self.log = self._index.log
        """Recent transitions of every pod (bounded): "why is this pod here?"."""
        self._usage = CallerUsage(catalog)
        self._sessions = Sessions()
        self._leases: dict[str, LeaseRecord] = {}
        """Job id -> its live lease. A pod whose ``job_id`` is set is in its job's lease; a
        lease keeps its pods that are gone (``DELETED``) until the job is released."""
        self._switched: list[DeletePod] = []
        """Pods a session switch retired inside a claim, not yet handed to the shell."""
        self._resetting: dict[str, Session] = {}
        """Job id -> the session its one pod will be held for once its reset (in progress,
        the job already answered) reports clean; ``release`` removes it."""
        self._resetting_sessions: dict[Session, int] = {}
        """Session -> how many of its pods are in such a reset: its claims wait for them."""

    # -- pods appear, become ready, vanish -------------------------------------------------
    def add_pod(self, pod: PodInfo, now: float, *, reserved: bool = True) -> bool:
        """Track a pod the shell is about to ask the backend for (``STARTING``; ``IDLE`` is
        accepted for a pod found ready). The tracker takes ownership of ``pod``.

        ``reserved``: the scaler already reserved the pod's budget units (every active
        ``CreatePod`` it returns); pass ``False`` for a pod found outside a plan, whose units
        are then recorded even past the budget.

        Returns ``False``, tracking nothing, for a planned standby whose card's group is gone
        (its last pod left between the plan and this call, which another thread can do):
        the card's units were released, so the shell must drop that create.
        """
        with self._lock:
            index = self._index
            if reserved and pod.role != "active" and not may_stage_standby_locked(index, pod):
                return False
            if pod.name in index.pods:
                raise ValueError(f"pod {pod.name!r} is already tracked")
            spec = self._specs.get(pod.sku)
            if spec is None:
                raise ValueError(f"pod {pod.name!r} has unknown sku {pod.sku!r}")
            if pod.state is not PodState.STARTING and pod.state is not _IDLE:
                raise ValueError("add_pod takes STARTING or IDLE pods; use restore() for others")
            pod.job_id = None
            index.add_locked(pod)
            join_group_locked(index, self.ledger, spec, pod, reserved=reserved)
            if pod.state is _IDLE:
                settle_idle_locked(pod, spec.hold_s, now)
                index.offer_locked(pod)
            return True

    def pod_ready(self, name: str, now: float, gpu: str | None = None) -> None:
        """STARTING -> IDLE: the agent answered. ``gpu``: the card the backend placed it on,
        when it was not known at create time."""
        with self._lock:
            index = self._index
            pod = index.pods.get(name)
            if pod is None or pod.state is not PodState.STARTING:
                return  # deleted or retired while starting: nothing to do
            if gpu is not None and pod.gpu is None:
                pod.gpu = gpu
                spec = self._specs[pod.sku]
                join_group_locked(index, self.ledger, spec, pod, reserved=True, moved=True)
            index.move_locked(pod, _IDLE, "ready", now)
            if pod.owner is None:
                pod.released_at = now
            index.offer_locked(pod)

    def pod_gone(self, name: str, now: float) -> str | None:
        """The pod vanished, its delete completed, or its create failed: forget it, release
        its budget when its group empties, open a GPU gate it held. Returns the job it was
        leased to, if any; that job's other pods stay leased until ``release``."""
        with self._lock:
            pod = self._index.forget_locked(name, now)
            if pod is None:
                return None
            job_id = pod.job_id
            if job_id is not None and self._limited and job_id in self._leases:
                req = self._leases[job_id][0]
                self._usage.add_locked(req.caller, -1, -gpus_per_pod(self._spec_locked(req.sku)))
            leave_group_locked(self._index, self.ledger, self._spec_locked(pod.sku), pod)
            return job_id

    # -- claim -----------------------------------------------------------------------------
    def claim(self, req: ClaimRequest, now: float) -> Lease | Miss:
        """All of ``req.pods`` pods in one step, or nothing (a ``Miss`` saying why). The
        order is ``claim_policy``'s; per-caller limits are checked in the same step."""
        with self._lock:
            spec = self._specs.get(req.sku)
            if spec is None:
                return _MISSES["unknown_sku"]
            if self._limited:
                over = self._usage.over_locked(req, spec)
                if over is not None:
                    return _MISSES[over]
            job_id = req.job_id
            if job_id in self._leases:
                raise ValueError(f"job {job_id!r} already holds a lease")
            if req.pods == 1 and not req.single_use:
                pod = self._index.lease_warm_locked(req, now)  # its own pod, same session
                if pod is not None:
                    self._leases[job_id] = (req, (pod,), ())
                    if self._limited:
                        self._usage.add_locked(req.caller, 1, gpus_per_pod(spec))
                    return _new_lease(Lease, (job_id, (pod.name,), "warm", None))
                if self._resetting_sessions and _session(req) in self._resetting_sessions:
                    return _MISSES["own_pod_resetting"]  # warm in a moment: wait for it
                got = claim_cold_locked(self._index, self._sessions, req, spec, now)
                miss = "no_idle_pod"
            else:
                if req.pods < 1:
                    raise ValueError(f"job {job_id!r} asks for {req.pods} pods")
                got = claim_many_locked(self._index, self._sessions, req, spec, now)
                miss = "gang_unplaceable" if req.pods > 1 else "no_idle_pod"
            if got is None:
                return _MISSES[miss]
            pods, path, reason, promoted, retired = got
            self._switched.extend(retired)
            self._leases[job_id] = (req, pods, promoted)
            if self._limited:
                self._usage.add_locked(req.caller, len(pods), gpus_per_pod(spec) * len(pods))
            return _new_lease(Lease, (job_id, tuple(map(_name, pods)), path, reason))

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

    @property
    def limited(self) -> bool:
        """Whether the catalog sets any per-caller limit (``within_limits`` has work)."""
        return self._limited

    def within_limits(self, demand: Demand | Sequence[ClaimRequest]) -> Demand:
        """The jobs of ``demand`` that their callers' own limits would let run at once, in
        dispatch order, counting each caller's leased pods and the jobs before: what
        the scaler may plan pods for. A caller with 3 jobs queued and ``max_pods: 1`` counts
        for one: counted for 3, it would make the scaler break other callers' holds for pods
        it could never use."""
        if not isinstance(demand, Demand):
            demand = Demand.of(demand)
        with self._lock:
            return self._usage.within_locked(demand, self._specs)

    def take_retired(self) -> list[DeletePod]:
        """Deletes for pods a claim retired (a session switch), for the shell to carry out;
        each is returned once. ``dispatch_pass`` and ``expire`` drain it.

        The emptiness check runs without the lock (every pass of every pool calls this; only
        ``switch`` pools ever fill it): a delete appended concurrently is returned by the next
        drain, as it would be had it come a moment later."""
        if not self._switched:
            return []
        with self._lock:
            out, self._switched = self._switched, []
            return out

    # -- after the claim -------------------------------------------------------------------
    def launched(self, job_id: str, now: float) -> None:
        """ASSIGNED -> RUNNING once the durable commit succeeded. The pod now records its
        caller, queue and tag (what the shell persists as ownership annotations)."""
        with self._lock:
            rec = self._leases.get(job_id)
            if rec is not None:
                for pod in rec[1]:
                    if pod.job_id == job_id and pod.state is _ASSIGNED:
                        self._index.launch_locked(pod, rec[0], now)

    def unclaim(self, job_id: str, now: float) -> None:
        """The durable commit failed: every pod goes back exactly as it was (same owner, tag,
        hold and role; a promoted standby is a standby again). Only before ``launched``."""
        with self._lock:
            rec = self._leases.get(job_id)
            if rec is None:
                return
            req, pods, promoted = rec
            live = [p for p in pods if p.job_id == job_id and p.state is not _DELETED]
            for pod in live:
                if pod.state is not _ASSIGNED:
                    raise IllegalTransition(f"unclaim of {job_id}: {pod.name} is {pod.state}")
            del self._leases[job_id]
            for pod in live:
                if self._limited:
                    self._usage.add_locked(req.caller, -1, -gpus_per_pod(self._specs[req.sku]))
                role = "standby" if pod.name in promoted else pod.role
                self._index.unlease_locked(pod, role, now)

    def release(self, job_id: str, clean: bool, now: float) -> list[PodRelease]:
        """The job ended and each pod's reset reported ``clean`` (processes verified dead,
        scratch wiped) or not. A pod is held for the job's caller and session until
        ``now + hold_s`` (``holds``), or retires (RETIRING: the shell deletes it, then calls
        ``pod_gone``) for the first of these reasons: ``unclean_reset``; ``session_boundary``
        (it crossed one for this job, ``recycled``, or its caller has switched sessions
        since, ``switch`` pools); ``single_use``; ``stale_template`` (its pool moved on);
        ``no_owner_hold`` (``hold_s`` is 0). A clean reset opens the GPU gate; an unclean
        one keeps it closed until the pod is gone."""
        with self._lock:
            rec = self._leases.pop(job_id, None)
            if rec is None:
                return []
            index = self._index
            req, pods, _ = rec
            if self._resetting:
                self._reset_done_locked(job_id)
            spec, hold, _ = self._release_terms[req.sku]
            out: list[PodRelease] = []
            for pod in pods:
                if pod.job_id != job_id or pod.state is _DELETED:
                    continue
                if self._limited:
                    self._usage.add_locked(req.caller, -1, -gpus_per_pod(spec))
                why = "unclean_reset" if not clean else self._retire_reason_locked(pod, req)
                if why is None:
                    index.hold_locked(pod, req, now + hold, now)
                    out.append(_new_release(PodRelease, (pod.name, False, "held")))
                    continue
                index.end_job_locked(pod, req, why, clean, now)
                out.append(PodRelease(pod.name, True, why))
            return out

    def _retire_reason_locked(self, pod: PodInfo, req: ClaimRequest) -> str | None:
        """Why ``pod``, its job ``req`` ended and reset clean, retires rather than being held
        for the job's session; None when it is held."""
        spec, hold, switch = self._release_terms[req.sku]
        if pod.retire_after or (switch and self._sessions.left_locked(req)):
            return "session_boundary"
        if pod.single_use:
            return "single_use"
        if pod.template != spec.template:
            # A rollout: past the drain budget the pod is held like a current one (and
            # serves on) until the scaler retires it within the budget.
            return "stale_template" if self._may_drain_locked(spec) else None
        if hold <= 0:
            return "no_owner_hold"
        return None

    def resetting(self, job_id: str) -> bool:
        """The job ended, its outcome is committed, and it is answered before its pods' reset.
        If it ran on one pod that a clean reset will hold for its session, the session's
        claims miss (``own_pod_resetting``, no demand) until ``release``, so its next job runs
        warm on that pod after the reset: never on the resetting pod, never on another pod
        while its own resets. True if it did; False (nothing changes) for a gang, a
        single-use job, or a pod that retires anyway."""
        with self._lock:
            rec = self._leases.get(job_id)
            if rec is None or job_id in self._resetting:
                return False
            req, pods, _ = rec
            if req.pods != 1 or len(pods) != 1 or req.single_use:
                return False
            pod = pods[0]
            if pod.job_id != job_id or pod.state is _DELETED:
                return False
            if self._retire_reason_locked(pod, req) is not None:
                return False
            session = _session(req)
            self._resetting[job_id] = session
            self._resetting_sessions[session] = self._resetting_sessions.get(session, 0) + 1
            return True

    def reset_over(self, job_id: str) -> None:
        """The reset ``resetting`` announced ended without a ``release`` (it raised, or the
        broker stops): the session's claims stop waiting for the pod. A no-op after
        ``release``, which ends the wait itself."""
        with self._lock:
            if self._resetting:
                self._reset_done_locked(job_id)

    def _reset_done_locked(self, job_id: str) -> None:
        session = self._resetting.pop(job_id, None)
        if session is not None:
            left = self._resetting_sessions[session] - 1
            if left:
                self._resetting_sessions[session] = left
            else:
                del self._resetting_sessions[session]

    # -- retirement and the scaler ---------------------------------------------------------
    def expire(self, now: float) -> list[DeletePod]:
        """Owner holds past ``hold_until`` retire (never handed to anyone else); the deletes
        a session switch left for ``take_retired`` go out with them."""
        with self._lock:
            return self._expire_locked(now)

    def _expire_locked(self, now: float) -> list[DeletePod]:
        out, self._switched = self._switched, []
        out.extend(expire_locked(self._index, now, self._keep_stale_locked))
        return out

    # -- template rollout and catalog swaps ------------------------------------------------
    def _spec_locked(self, sku: str) -> PoolSpec:
        """The spec of ``sku``, or of the pool by that name a catalog swap removed."""
        spec = self._specs.get(sku)
        return spec if spec is not None else self._departed[sku]

    def _draining_locked(self, sku: str) -> int:
        """Groups of pool ``sku`` retiring now (a delete in flight; one GPU's pods count
        once). Walks every pod: called only for old-template pods, during a rollout."""
        groups = {
            pod.gpu or "/" + pod.name
            for pod in self._index.pods.values()
            if pod.state is _RETIRING and pod.sku == sku
        }
        return len(groups)

    def _may_drain_locked(self, spec: PoolSpec) -> bool:
        """Whether one more old-template group of ``spec``'s pool may retire now: its
        retiring groups are under its ``drain_budget``."""
        return self._draining_locked(spec.sku) < spec.drain_budget

    def _keep_stale_locked(self, pod: PodInfo) -> bool:
        """An expired hold that does not retire: an old-template pod whose pool is at its
        drain budget (the scaler's ``stale_template`` deletes take it later)."""
        spec = self._specs.get(pod.sku)
        if spec is None or pod.template == spec.template:
            return False
        return not self._may_drain_locked(spec)

    def swap_catalog(self, catalog: Catalog, now: float) -> list[DeletePod]:
        """Serve ``catalog`` from now on (a reload), or refuse it whole with
        ``CatalogChangeRefused`` (nothing changes) when it would strand live state:

        * it removes a pool that has a pod leased to a job (a running job would lose the
          spec its release reads); a pool whose pods are all unleased is removed, its pods
          retired (``pool_removed``, the returned deletes, for the shell);
        * it changes a pool's ``accelerator`` or ``units_per_pod`` while that pool has pods
          (their budget units were reserved under the old values).

        Everything else applies at once: a changed ``template`` makes the pool's pods stale
        (they retire within its ``drain_budget``: ``release``, ``expire`` and the scaler),
        budgets and per-caller limits apply to the next claim and create (usage is
        recounted from the live leases), and pool knobs to the next pass. Serialised with
        ``reconcile`` (a pass plans on one catalog)."""
        with self._reconcile_lock, self._lock:
            index = self._index
            new_pools = catalog.pools
            problems: set[str] = set()
            leased: dict[str, int] = {}
            for pod in index.pods.values():
                if pod.state is _DELETED:
                    continue
                old, new = self._specs.get(pod.sku), new_pools.get(pod.sku)
                if old is None:
                    continue  # a departed pool's retiring pod
                if new is None:
                    if pod.job_id is not None:
                        leased[pod.sku] = leased.get(pod.sku, 0) + 1
                elif (new.accelerator, new.units_per_pod) != (old.accelerator, old.units_per_pod):
                    problems.add(
                        f"pool {pod.sku!r} changes its accelerator or units_per_pod while it "
                        f"has pods (their budget units were reserved under the old values): "
                        f"give the changed pool a new name, or restart the broker"
                    )
            for sku, n in sorted(leased.items()):
                problems.add(
                    f"pool {sku!r} is removed but {n} of its pods run jobs: it is removed "
                    f"once they have ended"
                )
            if problems:
                raise CatalogChangeRefused("; ".join(sorted(problems)))
            for sku, spec in self._specs.items():
                if sku not in new_pools:
                    self._departed[sku] = spec
            for sku in new_pools:
                self._departed.pop(sku, None)
            self.catalog = catalog
            self._specs = dict(new_pools)
            self._release_terms = {
                sku: (spec, spec.hold_s, spec.tag_mode == "switch")
                for sku, spec in self._specs.items()
            }
            self._limited = catalog.has_limits
            self._usage = CallerUsage(catalog)
            if self._limited:
                for job_id, (req, pods, _) in self._leases.items():
                    live = sum(1 for p in pods if p.job_id == job_id and p.state is not _DELETED)
                    per = gpus_per_pod(self._spec_locked(req.sku))
                    self._usage.add_locked(req.caller, live, per * live)
            self.ledger.set_budgets(catalog.budgets)
            out: list[DeletePod] = []
            for pod in list(index.pods.values()):
                if pod.sku in self._departed and index.retire_locked(pod, "pool_removed", now):
                    out.append(DeletePod(pod.name, "pool_removed"))
            return out

    def _rows_locked(self) -> tuple[list[tuple[Any, ...]], dict[str, PoolSpec]]:
        """Every pod's ``row_of`` tuple and the specs to classify them by (one catalog):
        a departed pool's pods are left out, as no pass plans for them."""
        specs = self._specs
        pods = self._index.pods.values()
        if self._departed:
            return [row_of(p) for p in pods if p.sku in specs], specs
        return list(map(row_of, pods)), specs

    def retire(self, name: str, reason: str, now: float) -> bool:
        """Mark an unleased pod RETIRING before the shell deletes it, so it is never claimed
        and no later pass deletes it again. ``False`` if it is leased, retiring or gone."""
        with self._lock:
            pod = self._index.pods.get(name)
            return pod is not None and self._index.retire_locked(pod, reason, now)

    def reconcile(self, demand: Demand | Sequence[ClaimRequest], now: float) -> list[Action]:
        """One scaler pass: expire holds, plan on a snapshot, and mark every planned delete
        RETIRING (dropping deletes of pods claimed meanwhile). The shell then executes the
        returned actions: ``add_pod`` for each create before the next pass, then the backend
        call; the backend delete, then ``pod_gone``.

        ``expire`` and ``snapshot`` share one hold of ``_lock``, and the planned deletes are
        marked under one more (the plan runs outside it): a valid order of the separate
        ``expire``, ``snapshot`` and ``retire`` calls, in two lock round trips, not one per
        delete."""
        with self._reconcile_lock:
            with self._lock:
                actions: list[Action] = list(self._expire_locked(now))
                rows, specs = self._rows_locked()
            planned = plan(build_snapshot(rows, specs, now), demand, now, self.ledger)
            if now < self._holds_kept_until:
                kept = self._restored_holds
                planned = [a for a in planned if not _breaks_one_of(a, kept)]
            if planned:
                with self._lock:
                    index = self._index
                    for action in planned:
                        if isinstance(action, CreatePod):
                            actions.append(action)
                            continue
                        pod = index.pods.get(action.name)
                        if pod is not None and index.retire_locked(pod, action.reason, now):
                            actions.append(action)
            return actions

    def quiet_until(self, now: float) -> float:
        """How long ``reconcile`` with no demand stays a no-op: if one at ``now`` returned no
        action, one at any later time before the returned one returns none either, as long
        as no pod, lease, card or budget changes in between. That is the first owner hold
        to expire or unheld idle group to pass its keep-alive after ``now`` (``inf`` if
        none): the only inputs of a pass without demand that move with time alone. (A
        claim can fill ``take_retired``'s list, but only a queued job claims.)"""
        with self._lock:
            holds = self._index.hold_ends_locked()
            rows, specs = self._rows_locked()
        soonest = next_keepalive_expiry(build_snapshot(rows, specs, now), now)
        for until in holds:
            if until is not None and now < until < soonest:  # expired iff ``until <= now``
                soonest = until
        return soonest

    # -- restart and the exclusivity sweep -------------------------------------------------
    def restore(
        self,
        pods: Iterable[PodInfo],
        now: float,
        jobs: Mapping[str, ClaimRequest] | None = None,
    ) -> list[DeletePod]:
        """Rebuild everything from the backend's pods after a restart (``recovery``).
        ``jobs``: the store's RUNNING jobs by id, whose caller, queue and tag win over the
        pods' annotations. Returns deletes for pods this catalog cannot track, and for idle
        pods marked to retire after a job that has ended. No hold restored here is broken
        for ``RESTORED_HOLD_GRACE_S`` after ``now``."""
        with self._lock:
            self._index.clear_locked()
            self._usage.clear_locked()
            self._sessions.clear_locked()
            self._leases.clear()
            self._resetting.clear()
            self._resetting_sessions.clear()
            self.ledger.clear()
            usage = self._usage if self._limited else None
            orphans, leases = restore_locked(
                self._index, self.ledger, usage, self._specs, pods, now, jobs or {}
            )
            self._leases.update(leases)
            pods_now = self._index.pods.values()
            self._restored_holds = frozenset(p.name for p in pods_now if p.owner is not None)
            self._holds_kept_until = now + RESTORED_HOLD_GRACE_S
            return orphans

    def mark_gpu_verified(self, gpu: str, exclusive: bool, now: float) -> None:
        """The sweep read the card's usage: ``exclusive`` iff every share on it belongs to
        this group (a card missing from the report is not exclusive). A failed read must not
        call this at all: it changes nothing that tick."""
        with self._lock:
            self._index.set_exclusive_locked(gpu, exclusive)

    # -- views -----------------------------------------------------------------------------
    def get(self, name: str) -> PodInfo | None:
        with self._lock:
            pod = self._index.pods.get(name)
            return None if pod is None else replace(pod)

    def pods(self) -> list[PodInfo]:
        """Copies of every pod, for /v1/pools and persistence (fields copied under the lock,
        objects built after it)."""
        with self._lock:
            rows = list(map(_pod_fields, self._index.pods.values()))
        return [PodInfo(*row) for row in rows]

    def history(self, name: str) -> list[tuple[float, str, str, str]]:
        """``(now, old, new, reason)`` of the pod's transitions still in the log."""
        with self._lock:
            return self.log.of(name)

    def lease_of(self, job_id: str) -> tuple[str, ...] | None:
        """The pods leased to ``job_id`` (``None`` if it holds none)."""
        with self._lock:
            rec = self._leases.get(job_id)
            return None if rec is None else tuple(map(_name, rec[1]))

    def gpu_verified(self, gpu: str) -> bool:
        with self._lock:
            return self._index.verified_locked(gpu)

    def gate_holder(self, gpu: str) -> str | None:
        """The pod whose job holds ``gpu``'s gate closed; ``None`` while it is open."""
        with self._lock:
            return self._index.gates.get(gpu)

    def claimable(self) -> list[str]:
        """The names of the pods a claim could take now, each once (a repeat would be a
        bug), in no particular order: for diagnostics and the invariant tests."""
        with self._lock:
            return self._index.listed_locked()

    def snapshot(self, now: float) -> PoolSnapshot:
        """Group counts per pool for the scaler: rows copied under the lock, classified
        after it is released."""
        with self._lock:
            rows, specs = self._rows_locked()
        return build_snapshot(rows, specs, now)
