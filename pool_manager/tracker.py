"""The pod tracker: every pod by name, SKU, owner and job, behind one lock (paper §3, A.1).

Claim, launch, unclaim and release are each one step under ``_lock``: finding eligible pods
(``claim_policy``), checking per-caller limits, validating the transitions and recording the
lease happen together, so no two dispatchers claim the same pod or overrun a limit. Nothing
inside the lock does I/O, logs, sleeps or reads a clock: time is passed in (``now``), which
is what lets the simulator and the property tests drive this exact code.

Lifecycle of a pod, from the shell's side: ``add_pod`` (STARTING, right after a create is
planned) -> ``pod_ready`` (IDLE) -> ``claim`` (ASSIGNED) -> ``launched`` (RUNNING) ->
``release`` (IDLE held for its owner, or RETIRING) -> ... -> the shell deletes a RETIRING pod
-> ``pod_gone``. ``unclaim`` undoes a claim whose durable commit failed.

Concurrency rule: public methods take ``_lock``; helpers ending in ``_locked`` assume it is
held. ``reconcile`` additionally serialises scaler passes with ``_reconcile_lock`` (never
taken while ``_lock`` is held), so two passes never plan the same create or delete.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import fields, replace
from operator import attrgetter
from typing import Any

from pool_manager.budgets import BudgetLedger
from pool_manager.catalog import Catalog
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
from pool_manager.pod_index import add, discard, gpus_per_pod
from pool_manager.recovery import Recovery
from pool_manager.scaler import next_keepalive_expiry, plan
from pool_manager.snapshot import PoolSnapshot, build_snapshot, row_of
from pool_manager.states import (
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
_pod_fields = attrgetter(*(f.name for f in fields(PodInfo)))
_new_lease = _new_release = tuple.__new__  # NamedTuple construction without the Python shim
_RANK = {path: rank for rank, path in enumerate(PATH_ORDER)}
_MISSES = {
    r: Miss(r)
    for r in ("unknown_sku", "no_idle_pod", "gang_unplaceable", "caller_pod_limit",
              "caller_gpu_limit")
}  # fmt: skip


class Tracker(Recovery):
    """In-memory pod index and the claim policy. See the module docstring for the rules."""

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
        ``history``: pod transitions kept in ``log`` (all pods together)."""
        super().__init__(
            catalog, ledger if ledger is not None else BudgetLedger(catalog.budgets), history
        )
        self._lock: AbstractContextManager[Any] = lock if lock is not None else threading.Lock()
        self._reconcile_lock = threading.Lock()
        self._switched: list[DeletePod] = []
        """Pods a session switch retired inside a claim, not yet handed to the shell."""

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
            card = pod.gpu
            if reserved and pod.role != "active" and card is not None and card not in self._cards:
                return False
            if pod.name in self._pods:
                raise ValueError(f"pod {pod.name!r} is already tracked")
            if pod.sku not in self._specs:
                raise ValueError(f"pod {pod.name!r} has unknown sku {pod.sku!r}")
            if pod.state is not PodState.STARTING and pod.state is not _IDLE:
                raise ValueError("add_pod takes STARTING or IDLE pods; use restore() for others")
            pod.job_id = None
            self._pods[pod.name] = pod
            self._join_group_locked(pod, reserved=reserved)
            if pod.state is _IDLE:
                self._settle_idle_locked(pod, now)
                self._index_locked(pod)
            return True

    def pod_ready(self, name: str, now: float, gpu: str | None = None) -> None:
        """STARTING -> IDLE: the agent answered. ``gpu``: the card the backend placed it on,
        when it was not known at create time."""
        with self._lock:
            pod = self._pods.get(name)
            if pod is None or pod.state is not PodState.STARTING:
                return  # deleted or retired while starting: nothing to do
            if gpu is not None and pod.gpu is None:
                pod.gpu = gpu
                self._join_group_locked(pod, reserved=True, moved=True)
            transition(pod, _IDLE, "ready", now, _T, self.log, pod.name)
            if pod.owner is None:
                pod.released_at = now
            self._index_locked(pod)

    def pod_gone(self, name: str, now: float) -> str | None:
        """The pod vanished, its delete completed, or its create failed: forget it, release
        its budget when its group empties, open a GPU gate it held. Returns the job it was
        leased to, if any; that job's other pods stay leased until ``release``."""
        with self._lock:
            pod = self._pods.pop(name, None)
            if pod is None:
                return None
            if pod.state is _IDLE:
                self._unindex_locked(pod)
            job_id = pod.job_id
            if job_id is not None and self._limited and job_id in self._jobs:
                req = self._jobs[job_id][0]
                self._count_locked(req.caller, -1, -gpus_per_pod(self._specs[req.sku]))
            transition(pod, PodState.DELETED, "gone", now, _T, self.log, pod.name)
            self._leave_group_locked(pod, release=True)
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
                over = self._over_limit_locked(req, spec)
                if over is not None:
                    return _MISSES[over]
            if req.job_id in self._jobs:
                raise ValueError(f"job {req.job_id!r} already holds a lease")
            if req.pods != 1 or req.single_use:
                return self._claim_many_locked(req, now)
            sku, caller = req.sku, req.caller
            key = (sku, caller, req.queue, req.lease_tag)
            bucket = self._exact.get(key)
            if bucket:  # the hot path: the caller's own pod, same session
                # An emptied bucket stays (lazily swept): the next release refills it.
                name, pod = bucket.popitem()
                path = "warm"
                reason: str | None = None
                # transition(pod, _ASSIGNED, ...) inlined: a bucket holds only IDLE pods
                if pod.state is not _IDLE:
                    raise IllegalTransition(f"{name}: {pod.state} -> {_ASSIGNED} (warm)")
                pod.state = _ASSIGNED
                self.log.append((now, name, _IDLE, _ASSIGNED, "warm"))
            else:
                picked = self._pick_cold_locked(req, spec.tag_mode == "hint")
                if picked is None:
                    return _MISSES["no_idle_pod"]
                pod, path, reason = picked
                name = pod.name
                transition(pod, _ASSIGNED, path, now, _T, self.log, name)
                self._mark_taken_locked(pod, path)
                if spec.tag_mode == "switch":  # after the claim: its own pod is not idle
                    self._end_prior_sessions_locked(req, now)
            pod.job_id = req.job_id
            gpu = pod.gpu
            if gpu is not None:
                if len(self._cards[gpu]) > 1:
                    self._close_gate_locked(pod, gpu)
                else:  # a group of one: nothing to park
                    self._gates[gpu] = name
            pods = (name,)
            self._jobs[req.job_id] = (req, pods, pods if path == "standby" else ())
            if self._limited:
                self._count_locked(caller, 1, gpus_per_pod(spec))
            return _new_lease(Lease, (req.job_id, pods, path, reason))

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

    def _claim_many_locked(self, req: ClaimRequest, now: float) -> Lease | Miss:
        """Gangs and single-use jobs: N pods on distinct physical GPUs, all or nothing."""
        spec = self._specs[req.sku]
        if req.pods < 1:
            raise ValueError(f"job {req.job_id!r} asks for {req.pods} pods")
        picked = self._pick_many_locked(req, spec.tag_mode == "hint")
        if picked is None:
            return _MISSES["gang_unplaceable" if req.pods > 1 else "no_idle_pod"]
        coldest, reason = 0, None
        for pod, path, why in picked:
            self._unindex_locked(pod)
            self._take_locked(pod, req, path, now)
            rank = _RANK[path]
            if rank > coldest or (rank == coldest and reason is None):
                coldest, reason = rank, why
        if spec.tag_mode == "switch" and not req.single_use and coldest > 0:
            self._end_prior_sessions_locked(req, now)
        names = tuple(pod.name for pod, _, _ in picked)
        promoted = tuple(pod.name for pod, path, _ in picked if path == "standby")
        self._jobs[req.job_id] = (req, names, promoted)
        if self._limited:
            self._count_locked(req.caller, len(names), gpus_per_pod(spec) * len(names))
        if req.single_use:
            return Lease(req.job_id, names, "single_use", "single_use_requested")
        path = PATH_ORDER[coldest]
        return Lease(req.job_id, names, path, None if path == "warm" else reason)

    def _take_locked(self, pod: PodInfo, req: ClaimRequest, path: str, now: float) -> None:
        """Move one claimable pod, already out of its bucket, to ASSIGNED for ``req``; close
        its GPU's gate. (``claim`` inlines this for one pod.)"""
        transition(pod, _ASSIGNED, path, now, _T, self.log, pod.name)
        pod.job_id = req.job_id
        if path != "warm":
            self._mark_taken_locked(pod, path)
        if req.single_use:
            pod.single_use = True
        if pod.gpu is not None:
            self._close_gate_locked(pod, pod.gpu)

    def _end_prior_sessions_locked(self, req: ClaimRequest, now: float) -> None:
        """``tag_mode: switch``: the caller switched sessions on this queue (paper §5: "when
        a caller switches to a new session ... the prior pod is retired"). Its idle pods held
        for any other tag on ``req.queue`` retire now, so a session's state reaches at most
        the one job that recycled its pod; that includes its pods parked behind a closed
        GPU gate; and its pods busy with another tag's job retire after that job. Pods on
        other queues keep their holds. The deletes wait in ``_switched`` for
        ``take_retired``."""
        ended: list[PodInfo] = []
        sessions = self._owned.get((req.sku, req.caller))
        if sessions:
            prior = [s for s in sessions if s[0] == req.queue and s[1] != req.lease_tag]
            for queue, tag in prior:
                bucket = self._exact.get((req.sku, req.caller, queue, tag))
                ended.extend(bucket.values() if bucket else ())
        if self._gates:
            ended.extend(
                pod
                for pod in self._parked_locked()
                if pod.owner == req.caller and pod.sku == req.sku and pod.queue == req.queue
                and pod.tag != req.lease_tag
            )  # fmt: skip
        for pod in ended:
            if self._retire_locked(pod, "session_switched", now):
                self._switched.append(DeletePod(pod.name, "session_switched"))
        # Its pods busy with a prior session's job end that session too: ``release`` retires
        # them after it. (They came back held for the old tag, and a later job of the new
        # session recycled them: two of its jobs on the old session's pods, adversarial run.)
        self._sessions[(req.sku, req.caller, req.queue)] = req.lease_tag

    @property
    def limited(self) -> bool:
        """Whether the catalog sets any per-caller limit (``within_limits`` has work)."""
        return self._limited

    def within_limits(self, demand: Sequence[ClaimRequest]) -> list[ClaimRequest]:
        """The jobs of ``demand`` (in order) that their callers' own limits would let run at
        once, counting each caller's leased pods and the jobs before it in ``demand``: what
        the scaler may plan pods for. A caller with 3 jobs queued and ``max_pods: 1`` made
        the scaler break other callers' holds for pods it could never use (adversarial
        run); now it counts for one."""
        out: list[ClaimRequest] = []
        with self._lock:
            used: dict[str, tuple[int, int]] = {}
            for req in demand:
                spec = self._specs.get(req.sku)
                caller = req.caller
                pods, gpus = used.get(caller) or (
                    self._caller_pods.get(caller, 0),
                    self._caller_gpus.get(caller, 0),
                )
                more = req.pods * gpus_per_pod(spec) if spec is not None else 0
                pods, gpus = pods + req.pods, gpus + more
                if self.catalog.limits_for(caller).exceeded_by(pods, gpus if more else 0):
                    continue
                used[caller] = (pods, gpus)
                out.append(req)
        return out

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

    @staticmethod
    def _mark_taken_locked(pod: PodInfo, path: str) -> None:
        if path == "recycled":
            pod.retire_after = True  # across a session boundary: this job, then retire
        elif path == "standby":
            pod.role = "active"  # promoted: it holds the card now

    # -- after the claim -------------------------------------------------------------------
    def launched(self, job_id: str, now: float) -> None:
        """ASSIGNED -> RUNNING once the durable commit succeeded. The pod now records its
        caller, queue and tag (what the shell persists as ownership annotations)."""
        with self._lock:
            rec = self._jobs.get(job_id)
            if rec is None:
                return
            req = rec[0]
            for name in rec[1]:
                pod = self._pods.get(name)
                if pod is not None and pod.job_id == job_id and pod.state is _ASSIGNED:
                    transition(pod, _RUNNING, "launched", now, _T, self.log, pod.name)
                    pod.owner, pod.queue, pod.tag = req.caller, req.queue, req.lease_tag

    def unclaim(self, job_id: str, now: float) -> None:
        """The durable commit failed: every pod goes back exactly as it was (same owner, tag,
        hold and role; a promoted standby is a standby again). Only before ``launched``."""
        with self._lock:
            rec = self._jobs.get(job_id)
            if rec is None:
                return
            req, names, promoted = rec
            live = [p for p in map(self._pods.get, names) if p is not None and p.job_id == job_id]
            for pod in live:
                if pod.state is not _ASSIGNED:
                    raise IllegalTransition(f"unclaim of {job_id}: {pod.name} is {pod.state}")
            del self._jobs[job_id]
            for pod in live:
                if self._limited:
                    self._count_locked(req.caller, -1, -gpus_per_pod(self._specs[req.sku]))
                transition(pod, _IDLE, "unclaimed", now, _T, self.log, pod.name)
                pod.job_id = None
                pod.retire_after = False
                pod.single_use = False
                if pod.name in promoted:
                    pod.role = "standby"
                if pod.gpu is not None:
                    self._open_gate_locked(pod)
                self._index_locked(pod)

    def release(self, job_id: str, clean: bool, now: float) -> list[PodRelease]:
        """The job ended and each pod's reset reported ``clean`` (processes verified dead,
        scratch wiped) or not. Clean with no boundary: IDLE, held for the caller until
        ``now + hold_s``. Otherwise RETIRING (the shell deletes it, then calls ``pod_gone``).
        A clean reset opens the GPU gate; an unclean one keeps it closed until the pod is
        gone."""
        with self._lock:
            rec = self._jobs.pop(job_id, None)
            if rec is None:
                return []
            req = rec[0]
            spec = self._specs[req.sku]
            hold = self._holds[req.sku]
            switch, sessions, tag = spec.tag_mode == "switch", self._sessions, req.lease_tag
            out: list[PodRelease] = []
            for name in rec[1]:
                pod = self._pods.get(name)
                if pod is None or pod.job_id != job_id:
                    continue
                if self._limited:
                    self._count_locked(req.caller, -1, -gpus_per_pod(spec))
                pod.job_id = None
                pod.owner, pod.queue, pod.tag = req.caller, req.queue, req.lease_tag
                if not clean:
                    why = "unclean_reset"
                elif pod.retire_after or (
                    switch and sessions.get((req.sku, req.caller, req.queue), tag) != tag
                ):
                    why = "session_boundary"
                elif pod.single_use:
                    why = "single_use"
                elif pod.template != spec.template:
                    why = "stale_template"
                elif hold <= 0:
                    why = "no_owner_hold"
                else:
                    pod.released_at = now
                    pod.hold_until = until = now + hold
                    if until < self._next_expiry:  # indexed or parked below
                        self._next_expiry = until
                    # transition(pod, _IDLE, "released", ...) inlined for the hot path
                    old = pod.state
                    if _IDLE not in _T[old]:
                        raise IllegalTransition(f"{name}: {old} -> {_IDLE} (released)")
                    pod.state = _IDLE
                    self.log.append((now, name, old, _IDLE, "released"))
                    gpu = pod.gpu
                    if gpu is not None and self._gates.get(gpu) == name:
                        del self._gates[gpu]  # verified dead: the card may serve again
                        if len(self._cards[gpu]) > 1:
                            self._reindex_card_locked(gpu)
                    if gpu is None or gpu not in self._gates:
                        # _index_locked for a used pod, inlined for the hot path
                        key = (req.sku, req.caller, req.queue, req.lease_tag)
                        bucket = self._exact.get(key)
                        if bucket is None:
                            self._exact[key] = {name: pod}
                            add(self._owned, key[:2], key[2:])
                        else:
                            bucket[name] = pod
                    out.append(_new_release(PodRelease, (name, False, "held")))
                    continue
                transition(pod, _RETIRING, why, now, _T, self.log, pod.name)
                if clean:
                    self._open_gate_locked(pod)
                out.append(PodRelease(name, True, why))
            return out

    # -- retirement ------------------------------------------------------------------------
    def expire(self, now: float) -> list[DeletePod]:
        """Owner holds past ``hold_until`` retire (never handed to anyone else)."""
        with self._lock:
            return self._expire_locked(now)

    def _expire_locked(self, now: float) -> list[DeletePod]:
        """``expire``, plus the deletes a session switch left in ``_switched``. One walk of
        ``_exact`` both finds expired holds and sweeps the buckets warm claims emptied (what
        ``_sweep_empty_locked`` does); before the first hold can have ended
        (``_next_expiry``) it only sweeps."""
        out, self._switched = self._switched, []
        expired: list[PodInfo] = []
        if now < self._next_expiry:
            exact = self._exact
            emptied = [key for key, bucket in exact.items() if not bucket] if exact else []
        else:
            emptied = []
            soonest = float("inf")  # of the holds that stay
            for key, bucket in self._exact.items():
                if not bucket:
                    emptied.append(key)
                    continue
                for pod in bucket.values():
                    until = pod.hold_until
                    if until is not None:
                        if until <= now:
                            expired.append(pod)
                        elif until < soonest:
                            soonest = until
            if self._gates:  # holds behind a closed gate expire too
                for pod in self._parked_locked():
                    until = pod.hold_until
                    if pod.owner is not None and until is not None:
                        if until <= now:
                            expired.append(pod)
                        elif until < soonest:
                            soonest = until
            self._next_expiry = soonest
        for key in emptied:
            del self._exact[key]
            discard(self._owned, key[:2], key[2:])
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
        transition(pod, _RETIRING, reason, now, _T, self.log, pod.name)
        return True

    def reconcile(self, demand: Sequence[ClaimRequest], now: float) -> list[Action]:
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
                rows = list(map(row_of, self._pods.values()))
            planned = plan(build_snapshot(rows, self._specs, now), demand, now, self.ledger)
            if planned:
                with self._lock:
                    for action in planned:
                        if isinstance(action, CreatePod):
                            actions.append(action)
                            continue
                        pod = self._pods.get(action.name)
                        if pod is not None and self._retire_locked(pod, action.reason, now):
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
            holds = [pod.hold_until for bucket in self._exact.values() for pod in bucket.values()]
            if self._gates:
                holds.extend(p.hold_until for p in self._parked_locked() if p.owner is not None)
            rows = list(map(row_of, self._pods.values()))
        soonest = next_keepalive_expiry(build_snapshot(rows, self._specs, now), now)
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
        pods marked to retire after a job that has ended."""
        with self._lock:
            return self._restore_locked(pods, now, jobs or {})

    def mark_gpu_verified(self, gpu: str, exclusive: bool, now: float) -> None:
        """The sweep read the card's usage: ``exclusive`` iff every share on it belongs to
        this group (a card missing from the report is not exclusive). A failed read must not
        call this at all: it changes nothing that tick."""
        with self._lock:
            self._set_exclusive_locked(gpu, exclusive)

    # -- views -----------------------------------------------------------------------------
    def get(self, name: str) -> PodInfo | None:
        with self._lock:
            pod = self._pods.get(name)
            return None if pod is None else replace(pod)

    def pods(self) -> list[PodInfo]:
        """Copies of every pod, for /v1/pools and persistence (fields copied under the lock,
        objects built after it)."""
        with self._lock:
            rows = list(map(_pod_fields, self._pods.values()))
        return [PodInfo(*row) for row in rows]

    def history(self, name: str) -> list[tuple[float, str, str, str]]:
        """``(now, old, new, reason)`` of the pod's transitions still in the log."""
        with self._lock:
            return self.log.of(name)

    def lease_of(self, job_id: str) -> tuple[str, ...] | None:
        """The pods leased to ``job_id`` (``None`` if it holds none)."""
        with self._lock:
            rec = self._jobs.get(job_id)
            return None if rec is None else rec[1]

    def gpu_verified(self, gpu: str) -> bool:
        with self._lock:
            return self._exclusive.get(gpu, False)

    def snapshot(self, now: float) -> PoolSnapshot:
        """Group counts per pool for the scaler: rows copied under the lock, classified
        after it is released."""
        with self._lock:
            rows = list(map(row_of, self._pods.values()))
        return build_snapshot(rows, self._specs, now)
