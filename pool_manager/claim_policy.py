"""Which pods a job gets: the claim order and the session boundary (paper §5, A.2, A.3).

Order per SKU, for a reusable job from ``caller`` on ``queue`` with ``tag``:

1. ``warm``: an idle pod ``caller`` last used with the same queue and tag (in ``hint`` tag
   mode, any of the caller's pods on the same queue: the tag only prefers);
2. ``recycled``: one of the caller's pods across a session boundary (a new tag, or another
   queue): it runs this one job and then retires, so state crosses at most one job;
3. ``idle``: a never-used idle pod (``new`` if it became ready after the job was queued);
4. ``standby``: a promotable standby (gate open, GPU verified exclusive);
5. otherwise a miss: the job stays queued and counts as demand.

A used pod is never offered to another caller: the owner is part of every bucket key.
Single-use jobs skip 1-2 (a used pod is not clean enough). A gang takes its N pods from the
same sources in the same order, on distinct physical GPUs, or nothing.

Concurrency: helpers of ``Tracker``; the tracker's lock is held. Each ``_pick`` takes the
pods it returns out of their buckets, except ``_pick_many_locked`` (which may still fail).
"""

from __future__ import annotations

from pool_manager.gpu_gate import GpuGates
from pool_manager.model import ClaimRequest, PodInfo
from pool_manager.pod_index import Bucket

Pick = tuple[PodInfo, str, str | None]


class ClaimPolicy(GpuGates):
    def _pick_cold_locked(self, req: ClaimRequest, hint: bool) -> Pick | None:
        """Everything after an exact warm match, for a one-pod, reusable job."""
        sku, caller = req.sku, req.caller
        sessions = self._owned.get((sku, caller))
        if sessions:
            empty = [s for s in sessions if not self._exact[(sku, caller, *s)]]
            for session in empty:  # emptied by warm claims: drop them now
                del self._exact[(sku, caller, *session)]
                del sessions[session]
            if not sessions:
                del self._owned[(sku, caller)]
        if sessions:
            chosen = None
            if hint:
                for session in reversed(sessions):
                    if session[0] == req.queue:
                        chosen = session
                        break
            path = "warm" if chosen is not None else "recycled"
            if chosen is None:
                chosen = next(reversed(sessions))
            queue, tag = chosen
            key = (sku, caller, queue, tag)
            bucket = self._exact[key]
            pod = bucket.popitem()[1]
            if not bucket:
                del self._exact[key]
                del sessions[chosen]
                if not sessions:
                    del self._owned[(sku, caller)]
            if path == "warm":
                return pod, path, None  # the tag is only a routing hint here
            return pod, path, "queue_changed" if queue != req.queue else "tag_changed"
        fresh = self._fresh.get(sku)
        if fresh:
            pod = fresh.popitem()[1]
            if not fresh:
                del self._fresh[sku]
            if pod.released_at is not None and pod.released_at > req.queued_at:
                return pod, "new", "no_idle_pod_when_queued"
            return pod, "idle", "no_owned_idle_pod"
        standby = self._standby.get(sku)
        if standby:
            pod = standby.popitem()[1]
            if not standby:
                del self._standby[sku]
            return pod, "standby", "no_idle_pod"
        return None

    def _pick_many_locked(self, req: ClaimRequest, hint: bool) -> list[Pick] | None:
        """``req.pods`` pods on distinct physical GPUs, warmest first; ``None`` if fewer."""
        sku, caller = req.sku, req.caller
        sources: list[tuple[Bucket | None, str, str | None]] = []
        if not req.single_use:
            sources.append((self._exact.get((sku, caller, req.queue, req.lease_tag)), "warm", None))
            for queue, tag in reversed(self._owned.get((sku, caller), {})):
                if (queue, tag) == (req.queue, req.lease_tag):
                    continue
                if queue == req.queue:
                    path, why = ("warm", None) if hint else ("recycled", "tag_changed")
                else:
                    path, why = "recycled", "queue_changed"
                sources.append((self._exact.get((sku, caller, queue, tag)), path, why))
        sources.append((self._fresh.get(sku), "idle", "no_owned_idle_pod"))
        sources.append((self._standby.get(sku), "standby", "no_idle_pod"))
        chosen: list[Pick] = []
        cards: set[str] = set()
        for bucket, path, why in sources:
            if not bucket:
                continue
            for pod in reversed(bucket.values()):
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
