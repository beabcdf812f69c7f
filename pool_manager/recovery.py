"""Restart recovery of the tracker (paper A.1): rebuild every index from the backend's pods.

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

Concurrency: helpers of ``Tracker``; its lock is held.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from pool_manager.claim_policy import ClaimPolicy
from pool_manager.model import ClaimRequest, DeletePod, PodInfo
from pool_manager.pod_index import gpus_per_pod
from pool_manager.states import POD_TRANSITIONS, PodState, transition

_IDLE = PodState.IDLE
_T = POD_TRANSITIONS


class Recovery(ClaimPolicy):
    def _settle_idle_locked(self, pod: PodInfo, now: float) -> None:
        """Fill in the times of an idle pod found (not made) idle: when it went idle and,
        for a used one, when its owner hold ends (a hold that never ends would never
        retire)."""
        if pod.released_at is None:
            pod.released_at = now
        if pod.owner is not None and pod.hold_until is None:
            pod.hold_until = pod.released_at + self._holds[pod.sku]

    def _restore_locked(
        self, pods: Iterable[PodInfo], now: float, jobs: Mapping[str, ClaimRequest]
    ) -> list[DeletePod]:
        self._clear_locked()
        self.ledger.clear()
        self.log.clear()
        orphans: list[DeletePod] = []
        leased: dict[str, list[PodInfo]] = {}
        kept: list[PodInfo] = []
        for src in pods:
            if src.sku not in self._specs or src.name in self._pods:
                orphans.append(DeletePod(src.name, "unknown_pod"))
                continue
            if src.state is PodState.DELETED:
                continue
            pod = replace(src)
            if pod.state is PodState.ASSIGNED:  # claimed, never committed: no user code ran
                transition(pod, _IDLE, "restored_unlaunched", now, _T, self.log, pod.name)
                pod.job_id, pod.retire_after, pod.single_use = None, False, False
            elif pod.state is PodState.RUNNING:
                if pod.job_id is None:
                    why = "restored_without_job"
                    transition(pod, PodState.RETIRING, why, now, _T, self.log, pod.name)
                else:
                    leased.setdefault(pod.job_id, []).append(pod)
            else:
                pod.job_id = None
                if pod.state is _IDLE and (pod.retire_after or pod.single_use):
                    # Marked to retire after a job that has ended: it never serves again.
                    why = "restored_retiring"
                    transition(pod, PodState.RETIRING, why, now, _T, self.log, pod.name)
                    orphans.append(DeletePod(pod.name, why))
            self._pods[pod.name] = pod
            self._join_group_locked(pod, reserved=False)
            kept.append(pod)
        for job_id, members in leased.items():
            first = members[0]
            req = jobs.get(job_id) or ClaimRequest(
                job_id, first.owner or "", first.sku, first.tag, first.queue or "default",
                len(members),
            )  # fmt: skip
            for pod in members:  # the store's record of the job wins over a stale annotation
                pod.owner, pod.queue, pod.tag = req.caller, req.queue, req.lease_tag
            self._jobs[job_id] = (req, tuple(p.name for p in members), ())
            if self._limited:
                n = len(members)
                self._count_locked(req.caller, n, n * gpus_per_pod(self._specs[first.sku]))
        for pod in kept:
            if pod.state is _IDLE:
                self._settle_idle_locked(pod, now)
                self._index_locked(pod)
        return orphans
