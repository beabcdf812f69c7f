"""The tracker's indexes and the bookkeeping helpers that keep them consistent.

Claim buckets hold only pods claimable *right now*, so every lookup is O(1):

* ``_exact[(sku, owner, queue, tag)]``: used pods held for their owner (owner-only reuse);
* ``_owned[(sku, owner)]``: the ``(queue, tag)`` keys of that owner's ``_exact`` buckets
  (per session, not per pod: cheap, and all a session-boundary lookup needs). A warm claim
  leaves an emptied bucket in place, since the release right after refills it; empty
  buckets are skipped by lookups and swept by ``expire`` (``_sweep_empty_locked``);
* ``_fresh[sku]``: never-used idle pods; ``_standby[sku]``: promotable standbys;
* ``_next_expiry``: no owner hold of an idle pod (in a bucket or parked) ends before it, so
  ``expire`` walks the holds only once one may have ended. Every pod that goes idle with a
  hold passes ``_index_locked`` or ``release``, which lower it; ``expire``'s walk sets it.

Each bucket is a dict used as an insertion-ordered set; the most recently idled pod is taken
first with ``popitem`` (warmest page cache, O(1) amortised, trims deleted slots).

Invariants (checked by the property tests after every step):

* an ``IDLE`` pod is in exactly one bucket iff it is claimable: its GPU gate is open and, for
  a standby, its GPU is verified exclusive; a used pod is only ever in its owner's bucket;
* each physical GPU (``_cards``), and each GPU-less pod, holds exactly one budget
  reservation of ``units_per_pod`` while it has a tracked pod (``gpu_gate``);
* ``_caller_pods`` / ``_caller_gpus`` count the assigned and running pods of each caller
  (maintained only when the catalog sets per-caller limits).

Concurrency: every method here assumes the owning ``Tracker``'s lock is held (``_locked``).
"""

from __future__ import annotations

from typing import Any

from pool_manager.budgets import BudgetLedger
from pool_manager.catalog import Catalog, PoolSpec
from pool_manager.model import ClaimRequest, PodInfo
from pool_manager.states import PodState, TransitionLog

Bucket = dict[str, PodInfo]
"""A claim bucket: pod name -> pod, insertion ordered (the value saves a lookup on claim)."""
Sessions = dict[tuple[str | None, str | None], None]
#: A live lease: the request, its pods, and which of them were standbys when claimed.
JobRecord = tuple[ClaimRequest, tuple[str, ...], tuple[str, ...]]

_IDLE = PodState.IDLE


def discard(index: dict[Any, Any], key: Any, item: Any) -> None:
    bucket = index.get(key)
    if bucket is not None and item in bucket:
        del bucket[item]
        if not bucket:
            del index[key]


def add(index: dict[Any, Any], key: Any, item: Any, value: Any = None) -> None:
    bucket = index.get(key)
    if bucket is None:
        index[key] = {item: value}
    else:
        bucket[item] = value


def gpus_per_pod(spec: PoolSpec) -> int:
    """GPUs one pod of ``spec`` counts against a caller's ``max_gpus`` (0 for CPU pools)."""
    return 0 if spec.accelerator == "cpu" else spec.units_per_pod


class PodIndex:
    """State of the tracker; see the module docstring for its invariants."""

    def __init__(self, catalog: Catalog, ledger: BudgetLedger, history: int) -> None:
        self.catalog = catalog
        self.ledger = ledger
        self.log = TransitionLog(history)
        """Recent pod transitions of every pod (bounded): "why is this pod here?"."""
        self._specs: dict[str, PoolSpec] = dict(catalog.pools)
        self._holds: dict[str, float] = {sku: spec.hold_s for sku, spec in self._specs.items()}
        self._limited = catalog.has_limits
        self._pods: dict[str, PodInfo] = {}
        self._exact: dict[tuple[str, str, str | None, str | None], Bucket] = {}
        self._owned: dict[tuple[str, str], Sessions] = {}
        self._fresh: dict[str, Bucket] = {}
        self._standby: dict[str, Bucket] = {}
        self._jobs: dict[str, JobRecord] = {}
        self._cards: dict[str, tuple[str, ...]] = {}
        """Physical GPU -> every tracked pod pinned to it (its active–standby group)."""
        self._gates: dict[str, str] = {}
        """Physical GPU -> the pod holding its gate; absent = open (``gpu_gate``)."""
        self._exclusive: dict[str, bool] = {}
        self._caller_pods: dict[str, int] = {}
        self._caller_gpus: dict[str, int] = {}
        self._sessions: dict[tuple[str, str, str], str | None] = {}
        """``switch`` pools: (sku, caller, queue) -> the caller's live session (lease tag) there,
        set when a claim switches to it; a pod released from another tag's job retires."""
        self._next_expiry = float("-inf")
        """A lower bound of every owner hold's end (``-inf``: unknown, walk them)."""

    def _clear_locked(self) -> None:
        for index in (self._pods, self._exact, self._owned, self._fresh, self._standby):
            index.clear()
        self._jobs.clear()
        self._cards.clear()
        self._gates.clear()
        self._exclusive.clear()
        self._caller_pods.clear()
        self._caller_gpus.clear()
        self._sessions.clear()
        self._next_expiry = float("-inf")

    # -- claim buckets ---------------------------------------------------------------------
    def _index_locked(self, pod: PodInfo) -> None:
        """Put an IDLE pod in its claim bucket if it is claimable now (else it is parked)."""
        until = pod.hold_until
        if until is not None and until < self._next_expiry:
            self._next_expiry = until
        gpu = pod.gpu
        if gpu is not None and gpu in self._gates:
            return
        if pod.role == "standby":
            if gpu is not None and self._exclusive.get(gpu, False):
                add(self._standby, pod.sku, pod.name, pod)
        elif pod.owner is None:
            add(self._fresh, pod.sku, pod.name, pod)
        else:
            key = (pod.sku, pod.owner, pod.queue, pod.tag)
            bucket = self._exact.get(key)
            if bucket is None:
                self._exact[key] = {pod.name: pod}
                add(self._owned, (pod.sku, pod.owner), (pod.queue, pod.tag))
            else:
                bucket[pod.name] = pod

    def _unindex_locked(self, pod: PodInfo) -> None:
        name = pod.name
        if pod.role == "standby":
            discard(self._standby, pod.sku, name)
        elif pod.owner is None:
            discard(self._fresh, pod.sku, name)
        else:
            key = (pod.sku, pod.owner, pod.queue, pod.tag)
            bucket = self._exact.get(key)
            if bucket is not None and name in bucket:
                del bucket[name]
                if not bucket:
                    del self._exact[key]
                    discard(self._owned, (pod.sku, pod.owner), (pod.queue, pod.tag))

    def _sweep_empty_locked(self) -> None:
        """Forget sessions whose bucket a warm claim emptied and no release refilled."""
        for key in [k for k, bucket in self._exact.items() if not bucket]:
            del self._exact[key]
            discard(self._owned, key[:2], key[2:])

    # -- per-caller limits -----------------------------------------------------------------
    def _over_limit_locked(self, req: ClaimRequest, spec: PoolSpec) -> str | None:
        caller = req.caller
        want = req.pods * gpus_per_pod(spec)
        return self.catalog.limits_for(caller).exceeded_by(
            self._caller_pods.get(caller, 0) + req.pods,
            self._caller_gpus.get(caller, 0) + want if want else 0,
        )

    def _count_locked(self, caller: str, pods: int, gpus: int) -> None:
        """Add (or, negative, remove) leased pods and GPUs to a caller's running totals."""
        left = self._caller_pods.get(caller, 0) + pods
        if left > 0:
            self._caller_pods[caller] = left
        else:
            self._caller_pods.pop(caller, None)
        if gpus:
            gleft = self._caller_gpus.get(caller, 0) + gpus
            if gleft > 0:
                self._caller_gpus[caller] = gleft
            else:
                self._caller_gpus.pop(caller, None)
