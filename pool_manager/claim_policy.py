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
Single-use jobs skip 1 and 4 (a used pod is not clean enough). A gang takes its N pods from the
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
                sessions = None
        if sessions and hint:
            for queue, tag in reversed(sessions):
                if queue == req.queue:  # the tag is only a routing hint here
                    return self._pop_session_locked(sku, caller, queue, tag), "warm", None
        fresh = self._fresh.get(sku)
        if fresh:
            pod = fresh.popitem()[1]
            if not fresh:
                del self._fresh[sku]
            if pod.released_at is not None and pod.released_at > req.queued_at:
                return pod, "new", "no_idle_pod_when_queued"
            if sessions:  # it has idle pods; the session boundary kept it off them
                same_queue = any(queue == req.queue for queue, _ in sessions)
                return pod, "idle", "tag_changed" if same_queue else "queue_changed"
            return pod, "idle", "no_owned_idle_pod"
        standby = self._standby.get(sku)
        if standby:
            pod = standby.popitem()[1]
            if not standby:
                del self._standby[sku]
            return pod, "standby", "no_idle_pod"
        if sessions:  # rather than wait for a new pod: once on the caller's old one
            queue, tag = next(reversed(sessions))
            pod = self._pop_session_locked(sku, caller, queue, tag)
            return pod, "recycled", "queue_changed" if queue != req.queue else "tag_changed"
        return None

    def _pop_session_locked(
        self, sku: str, caller: str, queue: str | None, tag: str | None
    ) -> PodInfo:
        """Take the most recent pod of one of ``caller``'s (non-empty) sessions."""
        key = (sku, caller, queue, tag)
        bucket = self._exact[key]
        pod = bucket.popitem()[1]
        if not bucket:
            del self._exact[key]
            sessions = self._owned[(sku, caller)]
            del sessions[(queue, tag)]
            if not sessions:
                del self._owned[(sku, caller)]
        return pod

    def _pick_many_locked(self, req: ClaimRequest, hint: bool) -> list[Pick] | None:
        """``req.pods`` pods on distinct physical GPUs, warmest first; ``None`` if fewer."""
        sku, caller = req.sku, req.caller
        fresh, standby = self._fresh.get(sku), self._standby.get(sku)
        if req.single_use and (len(fresh or ()) + len(standby or ())) < req.pods:
            return None  # only never-used pods and standbys serve it: too few, whatever cards
        sources: list[tuple[Bucket | None, str, str | None]] = []
        recycled: list[tuple[Bucket | None, str, str | None]] = []
        if not req.single_use:
            sources.append((self._exact.get((sku, caller, req.queue, req.lease_tag)), "warm", None))
            for queue, tag in reversed(self._owned.get((sku, caller), {})):
                bucket = self._exact.get((sku, caller, queue, tag))
                if (queue, tag) == (req.queue, req.lease_tag):
                    continue
                if queue == req.queue and hint:
                    sources.append((bucket, "warm", None))
                else:
                    boundary = "tag_changed" if queue == req.queue else "queue_changed"
                    recycled.append((bucket, "recycled", boundary))
        sources.append((fresh, "idle", "no_owned_idle_pod"))
        sources.append((standby, "standby", "no_idle_pod"))
        sources.extend(recycled)
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
