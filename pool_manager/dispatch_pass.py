"""One dispatcher pass as a pure decision (paper §3, A.1 step 1; A.2 gangs; §7 scaling).

Given the queued requests in priority order, claim each job's full pod set from the tracker;
a job that cannot be placed is skipped, so smaller jobs behind it proceed, and becomes demand;
but it is not overtaken in its pool by jobs of lower priority, and a gang by none: the jobs it
holds back wait, and are no demand, until it is placed.
When there is demand (or a reconcile is due) expire holds and ask the scaler for actions.
The broker's dispatcher and the simulator both call exactly this; neither has its own copy.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence
from typing import NamedTuple

from pool_manager.claim_queue import ClaimClass, ClaimQueue, Demand, DemandRun
from pool_manager.model import Action, ClaimRequest, Lease
from pool_manager.tracker import Tracker

_INF = float("inf")
_new = tuple.__new__  # NamedTuple construction without the Python shim (fields in order)
_OUT_OF_PODS = frozenset({"no_idle_pod", "gang_unplaceable"})
"""Miss reasons that say the pool, not the caller, lacks pods (never a per-caller limit)."""


class PassResult(NamedTuple):
    """What one pass decided (a ``NamedTuple``, like ``Lease``: one is built every pass)."""

    leases: list[Lease]
    """Jobs placed this pass, in the order they were claimed (dispatch order); the pass took
    them off the queue."""
    waiting: ClaimQueue
    """The queue the pass was given, holding what is left: the jobs still waiting."""
    actions: list[Action]
    """Creates and deletes for the shell to carry out: budget already reserved for each
    create, every delete already marked RETIRING in the tracker."""


def dispatch_pass(
    tracker: Tracker,
    queued: ClaimQueue | Sequence[ClaimRequest],
    now: float,
    reconcile: bool,
    replan_waiting: bool = True,
) -> PassResult:
    """Claim what can be placed now; plan capacity for the rest.

    ``queued``: the queue (placed jobs are taken off it), or a list in dispatch order
    (priority, then age), queued afresh. ``reconcile`` forces a scaler pass even with no
    demand (scale-down, floors, hold expiry). ``replan_waiting``: also plan whenever a job is
    left waiting; a caller that knows nothing changed since its last plan (no new job, no pod
    gone; creates in flight already count as supply) passes False and plans on its tick or
    on change only, which keeps snapshots off most passes.

    The jobs are visited in dispatch order, a class at a time (``claim_queue``): a class that
    misses stops for the pass (its later jobs would miss too), so a pass costs the classes
    queued and the jobs placed, not the jobs queued. What it decides is what claiming every
    job in turn would (the property test in tests/pool_manager/test_dispatch_pass.py).
    """
    queue = queued if isinstance(queued, ClaimQueue) else ClaimQueue(queued)
    leases: list[Lease] = []
    claim = tracker.claim
    # SKU -> the fewest pods a claim on it missed for want of pods in this pass. A single-use
    # job draws only on never-used idle pods and standbys, a subset of what every such miss
    # found too few of (on distinct GPUs), and claims only take pods away; so a single-use
    # job asking for at least that many would miss as well (a miss of its changes nothing):
    # it waits without the claim. A pod another thread readies meanwhile is found by the
    # next pass, as if it came later.
    short: dict[str, int] = {}
    # A job that missed for want of pods is not overtaken in its pool by jobs of lower
    # priority, and a gang that missed by any job: those behind it neither claim nor count as
    # demand until it is placed, so pods that come free gather for it and the scaler plans
    # (and breaks holds) for it alone. Otherwise a priority-100 job would wait (10.9 s) while
    # a priority-0 backlog runs on warm pods whose holds are spared for it, and a priority-100
    # gang would wait out a whole 40 s stream of 1-pod jobs. Jobs of equal priority still
    # pass a one-pod miss: another caller's warm pod is no use to it.
    missed_at: dict[str, float] = {}  # SKU -> jobs below this priority wait (inf: a gang)
    gang_missed: dict[str, tuple[int, float, int]] = {}  # SKU -> the dispatch key of its gang
    stopped: list[ClaimClass] = []  # classes that stopped with their head as demand
    heap = [(cls.sort_key(), cls.order, cls) for cls in queue.classes()]
    heapq.heapify(heap)
    while heap:
        key, _, cls = heap[0]
        req = cls.request()
        sku = req.sku
        if missed_at and req.priority < missed_at.get(sku, -_INF):
            heapq.heappop(heap)  # the whole class waits behind the miss: no demand
            continue
        if short and req.single_use and req.pods >= short.get(sku, req.pods + 1):
            heapq.heappop(heap)
            stopped.append(cls)
            continue
        got = claim(req, now)
        if isinstance(got, Lease):
            leases.append(got)
            cls.take_head()
            queue.taken(cls, req)
            if len(cls):
                heapq.heapreplace(heap, (cls.sort_key(), cls.order, cls))
            else:
                heapq.heappop(heap)
            continue
        heapq.heappop(heap)  # every later job of the class would miss the same way
        if got.reason == "own_pod_resetting":
            continue  # its own pod is held for it after the reset: no demand
        stopped.append(cls)
        if got.reason in _OUT_OF_PODS:
            if req.pods < short.get(sku, req.pods + 1):
                short[sku] = req.pods
            if req.pods > 1 and not req.single_use:
                missed_at[sku] = _INF
                gang_missed.setdefault(sku, key)
            elif sku not in missed_at:  # the queue is in priority order: the highest
                missed_at[sku] = req.priority
    # A stopped class is demand up to its pool's gang miss, if any (jobs behind a gang that
    # missed are no demand); the rest of the waiting jobs are no demand. A caller's jobs
    # count only as far as its own limits would let them run: as demand past them they would
    # make the scaler break other callers' holds and start pods the caller could not use.
    demand = Demand()
    for cls in stopped:
        count = len(cls)
        gang = gang_missed.get(cls.first.sku)
        if gang is not None:
            count = _up_to(cls, gang)
        if count:
            demand.append(DemandRun(cls.first, count, cls))
    if demand and tracker.limited:
        demand = tracker.within_limits(demand)
    if reconcile or (replan_waiting and demand):
        actions = tracker.reconcile(demand, now)  # a new list
    else:
        actions = []
        actions.extend(tracker.take_retired())  # a session switch in a claim above
    return _new(PassResult, (leases, queue, actions))


def _up_to(cls: ClaimClass, key: tuple[int, float, int]) -> int:
    """How many of ``cls``'s queued jobs come no later than dispatch key ``key``."""
    priority = -cls.first.priority
    if priority != key[0]:
        return len(cls) if priority < key[0] else 0
    entries, head = cls.entries, cls.head
    return bisect_right(entries, key[1:], lo=head, key=lambda e: e[:2]) - head
