"""The tracker's indexes and the bookkeeping helpers that keep them consistent.

Invariants (checked by the property tests after every step):

* every tracked pod is in ``_pods``; an ``IDLE`` pod is in exactly one claim bucket iff it is
  claimable: its GPU gate is open and, for a standby, its GPU is verified exclusive;
* a used pod (``owner`` set) is only ever in its owner's buckets;
* each physical GPU (a ``GpuGroup``), and each GPU-less pod, holds exactly one budget
  reservation of ``units_per_pod`` while it has a tracked pod;
* ``_caller_pods`` / ``_caller_gpus`` count the assigned and running pods of each caller
  (maintained only when the catalog sets per-caller limits).

Concurrency: every method here assumes the owning ``Tracker``'s lock is held (``_locked``).
"""

from __future__ import annotations

from typing import Any

from pool_manager.budgets import BudgetLedger
from pool_manager.catalog import Catalog, PoolSpec
from pool_manager.gpu_gate import GpuGroup
from pool_manager.model import ClaimRequest, PodInfo
from pool_manager.states import PodState

Bucket = dict[str, None]
_IDLE = PodState.IDLE
_RETIRING = PodState.RETIRING


class LiveJob:
    """A live lease: the job's pods and what release needs to know."""

    __slots__ = ("caller", "gpus", "job_id", "pods", "promoted", "queue", "sku", "tag")

    def __init__(
        self, req: ClaimRequest, pods: tuple[str, ...], promoted: tuple[str, ...], gpus: int
    ) -> None:
        self.job_id = req.job_id
        self.caller = req.caller
        self.sku = req.sku
        self.queue = req.queue
        self.tag = req.lease_tag
        self.pods = pods
        self.promoted = promoted
        """Pods that were standbys when claimed (``unclaim`` makes them standbys again)."""
        self.gpus = gpus
        """GPUs per pod counted against the caller's ``max_gpus`` (0 for CPU pools)."""


def discard(index: dict[Any, Bucket], key: Any, name: str) -> None:
    bucket = index.get(key)
    if bucket is not None and name in bucket:
        del bucket[name]
        if not bucket:
            del index[key]


def add(index: dict[Any, Bucket], key: Any, name: str) -> None:
    bucket = index.get(key)
    if bucket is None:
        index[key] = {name: None}
    else:
        bucket[name] = None


class PodIndex:
    """State of the tracker; see the module docstring for its invariants."""

    def __init__(self, catalog: Catalog, ledger: BudgetLedger) -> None:
        self.catalog = catalog
        self.ledger = ledger
        self._specs: dict[str, PoolSpec] = dict(catalog.pools)
        self._limited = catalog.has_limits
        self._pods: dict[str, PodInfo] = {}
        self._exact: dict[tuple[str, str, str | None, str | None], Bucket] = {}
        self._owned: dict[tuple[str, str], Bucket] = {}
        self._fresh: dict[str, Bucket] = {}
        self._standby: dict[str, Bucket] = {}
        self._jobs: dict[str, LiveJob] = {}
        self._groups: dict[str, GpuGroup] = {}
        self._exclusive: dict[str, bool] = {}
        self._caller_pods: dict[str, int] = {}
        self._caller_gpus: dict[str, int] = {}

    def _clear_locked(self) -> None:
        for d in (self._pods, self._exact, self._owned, self._fresh, self._standby):
            d.clear()
        self._jobs.clear()
        self._groups.clear()
        self._exclusive.clear()
        self._caller_pods.clear()
        self._caller_gpus.clear()

    # -- claim buckets ---------------------------------------------------------------------
    def _index_locked(self, pod: PodInfo) -> None:
        """Put an IDLE pod in its claim bucket if it is claimable now (else it is parked)."""
        gpu = pod.gpu
        if gpu is not None and self._groups[gpu].gate is not None:
            return
        if pod.role == "standby":
            if gpu is not None and self._exclusive.get(gpu, False):
                add(self._standby, pod.sku, pod.name)
        elif pod.owner is None:
            add(self._fresh, pod.sku, pod.name)
        else:
            add(self._exact, (pod.sku, pod.owner, pod.queue, pod.tag), pod.name)
            add(self._owned, (pod.sku, pod.owner), pod.name)

    def _unindex_locked(self, pod: PodInfo) -> None:
        name = pod.name
        if pod.role == "standby":
            discard(self._standby, pod.sku, name)
        elif pod.owner is None:
            discard(self._fresh, pod.sku, name)
        else:
            discard(self._exact, (pod.sku, pod.owner, pod.queue, pod.tag), name)
            discard(self._owned, (pod.sku, pod.owner), name)

    def _reindex_group_locked(self, group: GpuGroup) -> None:
        for name in group.pods:
            peer = self._pods[name]
            if peer.state is _IDLE:
                self._index_locked(peer)

    def _open_gate_locked(self, pod: PodInfo) -> None:
        """``pod``'s processes are verified dead (or it is gone): its GPU may serve again."""
        if pod.gpu is None:
            return
        group = self._groups.get(pod.gpu)
        if group is not None and group.gate == pod.name:
            group.gate = None
            self._reindex_group_locked(group)

    # -- groups and the budget ledger ------------------------------------------------------
    def _join_group_locked(self, pod: PodInfo, *, reserved: bool, moved: bool = False) -> None:
        """Attach ``pod`` to its GPU group (or stand alone) and settle its budget units.

        The scaler reserves for active creates only. A reserved pod that joins an existing
        group gives its reservation back (the group counts once); an unreserved pod that
        starts a group records its units. ``moved``: the pod's own reservation moves with it.
        """
        spec = self._specs[pod.sku]
        acc, units = spec.accelerator, spec.units_per_pod
        has_units = moved or (reserved and pod.role == "active")
        if pod.gpu is None:
            if not has_units:
                self.ledger.force(acc, units)
            return
        group = self._groups.get(pod.gpu)
        if group is None:
            group = self._groups[pod.gpu] = GpuGroup(pod.gpu, pod.sku)
            if not has_units:
                self.ledger.force(acc, units)
        elif has_units:
            self.ledger.release(acc, units)
        group.pods[pod.name] = None
        if group.gate is None:
            for name in group.pods:  # a leased pod on the card holds its gate
                peer = self._pods.get(name)
                if peer is not None and (peer.job_id is not None or peer.state is _RETIRING):
                    group.gate = name

    def _leave_group_locked(self, pod: PodInfo, *, release: bool) -> None:
        """Detach ``pod``; release the budget when the last pod of its group (or the
        GPU-less pod itself) leaves and ``release`` is set."""
        spec = self._specs[pod.sku]
        if pod.gpu is None:
            if release:
                self.ledger.release(spec.accelerator, spec.units_per_pod)
            return
        group = self._groups.get(pod.gpu)
        if group is None:
            return
        group.pods.pop(pod.name, None)
        if not group.pods:
            del self._groups[pod.gpu]
            if release:
                self.ledger.release(spec.accelerator, spec.units_per_pod)
        elif group.gate == pod.name:
            group.gate = None
            self._reindex_group_locked(group)

    # -- per-caller limits -----------------------------------------------------------------
    def _over_limit_locked(self, req: ClaimRequest, spec: PoolSpec) -> str | None:
        limits = self.catalog.limits_for(req.caller)
        pods = limits.max_pods
        if pods is not None and self._caller_pods.get(req.caller, 0) + req.pods > pods:
            return "caller_pod_limit"
        if limits.max_gpus is not None and spec.accelerator != "cpu":
            want = req.pods * spec.units_per_pod
            if self._caller_gpus.get(req.caller, 0) + want > limits.max_gpus:
                return "caller_gpu_limit"
        return None

    def _count_locked(self, caller: str, pods: int, gpus: int) -> None:
        self._caller_pods[caller] = self._caller_pods.get(caller, 0) + pods
        if gpus:
            self._caller_gpus[caller] = self._caller_gpus.get(caller, 0) + gpus

    def _uncount_locked(self, job: LiveJob, pods: int) -> None:
        if not self._limited:
            return
        caller = job.caller
        left = self._caller_pods.get(caller, 0) - pods
        if left > 0:
            self._caller_pods[caller] = left
        else:
            self._caller_pods.pop(caller, None)
        if job.gpus:
            gleft = self._caller_gpus.get(caller, 0) - job.gpus * pods
            if gleft > 0:
                self._caller_gpus[caller] = gleft
            else:
                self._caller_gpus.pop(caller, None)
