"""Restart recovery of the tracker (paper A.1): rebuild the pod state from the backend's pods.

The backend's pods are authoritative for ownership (labels and annotations: state, GPU, role,
owner, tag, queue, release time and hold, the job a running pod serves); the job store is
authoritative for jobs, and the broker's recovery re-attaches, releases or re-queues each
RUNNING job against what this rebuilt. Rules:

* a RUNNING pod with a ``job_id`` is a live lease again. Its caller, queue and tag come from
  the job store's request when the recovery passes it (``jobs``), else from the pod's
  annotations (``launched`` records them; step 4 is best-effort, so the store wins). A
  RUNNING pod without a job retires;
* an ASSIGNED pod never ran user code (its job never committed): it comes back IDLE as it
  was (same owner, tag and hold);
* the ledger is rebuilt with one reservation per group (even past a budget: it must match
  what exists); a retiring pod keeps its GPU's gate closed until it is gone (fail closed);
* every GPU is unverified: no standby promotion until the sweep calls ``mark_gpu_verified``;
* a pod marked to retire after its job (``retire_after``, ``single_use``: the shell persists
  the mark before the job runs) keeps the mark while leased, and retires at once if idle.

Concurrency: ``restore_locked`` assumes the tracker's lock is held.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from pool_manager.budgets import BudgetLedger
from pool_manager.caller_usage import CallerUsage
from pool_manager.catalog import PoolSpec
from pool_manager.gpu_gate import join_group_locked
from pool_manager.holds import settle_idle_locked
from pool_manager.model import ClaimRequest, DeletePod, PodInfo
from pool_manager.pod_index import PodIndex, gpus_per_pod
from pool_manager.states import PodState

_IDLE = PodState.IDLE
_RETIRING = PodState.RETIRING

LeaseRecord = tuple[ClaimRequest, tuple[PodInfo, ...], tuple[str, ...]]
"""A live lease, as the tracker keeps it: the request, its pods, and the names of those that
were standbys when claimed (``unclaim`` makes them standbys again)."""


def restore_locked(
    index: PodIndex,
    ledger: BudgetLedger,
    usage: CallerUsage | None,
    specs: Mapping[str, PoolSpec],
    pods: Iterable[PodInfo],
    now: float,
    jobs: Mapping[str, ClaimRequest],
) -> tuple[list[DeletePod], dict[str, LeaseRecord]]:
    """Track copies of ``pods`` in the emptied ``index`` and ``ledger`` (and ``usage``, when
    the catalog sets per-caller limits) by the rules above. Returns deletes for pods this
    catalog cannot track, and for idle pods marked to retire after a job that has ended;
    and the live leases, by job id."""
    orphans: list[DeletePod] = []
    leased: dict[str, list[PodInfo]] = {}
    kept: list[PodInfo] = []
    leases: dict[str, LeaseRecord] = {}
    for src in pods:
        if src.sku not in specs or src.name in index.pods:
            orphans.append(DeletePod(src.name, "unknown_pod"))
            continue
        if src.state is PodState.DELETED:
            continue
        pod = replace(src)
        if pod.state is PodState.ASSIGNED:  # claimed, never committed: no user code ran
            index.move_locked(pod, _IDLE, "restored_unlaunched", now)
            pod.job_id, pod.retire_after, pod.single_use = None, False, False
        elif pod.state is PodState.RUNNING:
            if pod.job_id is None:
                index.move_locked(pod, _RETIRING, "restored_without_job", now)
            else:
                leased.setdefault(pod.job_id, []).append(pod)
        else:
            pod.job_id = None
            if pod.state is _IDLE and (pod.retire_after or pod.single_use):
                # Marked to retire after a job that has ended: it never serves again.
                index.move_locked(pod, _RETIRING, "restored_retiring", now)
                orphans.append(DeletePod(pod.name, "restored_retiring"))
        index.add_locked(pod)
        join_group_locked(index, ledger, specs[pod.sku], pod, reserved=False)
        kept.append(pod)
    for job_id, members in leased.items():
        first = members[0]
        req = jobs.get(job_id) or ClaimRequest(
            job_id, first.owner or "", first.sku, first.tag, first.queue or "default",
            len(members),
        )  # fmt: skip
        for pod in members:  # the store's record of the job wins over a stale annotation
            pod.owner, pod.queue, pod.tag = req.caller, req.queue, req.lease_tag
        leases[job_id] = (req, tuple(members), ())
        if usage is not None:
            n = len(members)
            usage.add_locked(req.caller, n, n * gpus_per_pod(specs[first.sku]))
    for pod in kept:
        if pod.state is _IDLE:
            settle_idle_locked(pod, specs[pod.sku].hold_s, now)
            index.offer_locked(pod)
    return orphans, leases
