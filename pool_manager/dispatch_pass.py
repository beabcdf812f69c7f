"""One dispatcher pass as a pure decision (paper §3, A.1 step 1; A.2 gangs; §7 scaling).

Given the queued requests in priority order, claim each job's full pod set from the tracker;
a job that cannot be placed is skipped, so smaller jobs behind it proceed, and becomes demand;
but it is not overtaken in its pool by jobs of lower priority, and a gang by none: the jobs it
holds back wait, and are no demand, until it is placed.
When there is demand (or a reconcile is due) expire holds and ask the scaler for actions.
The broker's dispatcher and the simulator both call exactly this; neither has its own copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pool_manager.model import Action, ClaimRequest, Lease
from pool_manager.tracker import Tracker

_INF = float("inf")
_new = tuple.__new__  # NamedTuple construction without the Python shim (fields in order)
_OUT_OF_PODS = frozenset({"no_idle_pod", "gang_unplaceable"})
"""Miss reasons that say the pool, not the caller, lacks pods (never a per-caller limit)."""


class PassResult(NamedTuple):
    """What one pass decided (a ``NamedTuple``, like ``Lease``: one is built every pass)."""

    leases: list[Lease]
    """Jobs placed this pass, in the order they were claimed."""
    waiting: list[ClaimRequest]
    """Jobs left queued, order kept: the demand handed to the scaler, but for those held
    back behind a job that missed in their pool, those waiting for their own pod's reset
    (``Tracker.resetting``) and those past their caller's own limits
    (``Tracker.within_limits``)."""
    actions: list[Action]
    """Creates and deletes for the shell to carry out: budget already reserved for each
    create, every delete already marked RETIRING in the tracker."""


def dispatch_pass(
    tracker: Tracker,
    queued: Sequence[ClaimRequest],
    now: float,
    reconcile: bool,
    replan_waiting: bool = True,
) -> PassResult:
    """Claim what can be placed now; plan capacity for the rest.

    ``queued`` must be in dispatch order (priority, then age). ``reconcile`` forces a scaler
    pass even with no demand (scale-down, floors, hold expiry). ``replan_waiting``: also plan
    whenever a job is left waiting; a caller that knows nothing changed since its last plan
    (no new job, no pod gone; creates in flight already count as supply) passes False and
    plans on its tick or on change only, which keeps snapshots off most passes.
    """
    leases: list[Lease] = []
    waiting: list[ClaimRequest] = []
    claim = tracker.claim
    # SKU -> the fewest pods a claim on it missed for want of pods in this pass. A single-use
    # job draws only on never-used idle pods and standbys, a subset of what every such miss
    # found too few of (on distinct GPUs), and claims only take pods away; so a single-use
    # job asking for at least that many would miss as well (a miss of its changes nothing):
    # it waits without the claim, one lock round trip fewer, its place in ``waiting`` kept.
    # A pod another thread readies meanwhile is found by the next pass, as if it came later.
    short: dict[str, int] = {}
    # A job that missed for want of pods is not overtaken in its pool by jobs of lower
    # priority, and a gang that missed by any job: those behind it neither claim nor count as
    # demand until it is placed, so pods that come free gather for it and the scaler plans
    # (and breaks holds) for it alone. Otherwise a priority-100 job would wait (10.9 s) while
    # a priority-0 backlog runs on warm pods whose holds are spared for it, and a priority-100
    # gang would wait out a whole 40 s stream of 1-pod jobs. Jobs of equal priority still
    # pass a one-pod miss: another caller's warm pod is no use to it.
    missed_at: dict[str, float] = {}  # SKU -> jobs below this priority wait (inf: a gang)
    no_demand: list[ClaimRequest] = []  # waiting, but not demand
    for req in queued:
        if missed_at and req.priority < missed_at.get(req.sku, -_INF):
            waiting.append(req)
            no_demand.append(req)
            continue
        if short and req.single_use and req.pods >= short.get(req.sku, req.pods + 1):
            waiting.append(req)
            continue
        got = claim(req, now)
        if isinstance(got, Lease):
            leases.append(got)
            continue
        waiting.append(req)
        if got.reason == "own_pod_resetting":
            no_demand.append(req)  # its own pod is held for it after the reset: no demand
            continue
        if got.reason in _OUT_OF_PODS:
            if req.pods < short.get(req.sku, req.pods + 1):
                short[req.sku] = req.pods
            if req.pods > 1 and not req.single_use:
                missed_at[req.sku] = _INF
            elif req.sku not in missed_at:  # the queue is in priority order: the highest
                missed_at[req.sku] = req.priority
    # A caller's jobs count as demand only as far as its own limits would let them run: as
    # demand past them they would make the scaler break other callers' holds and start pods
    # the caller could not use.
    demand = waiting
    if no_demand:
        later = set(map(id, no_demand))
        demand = [req for req in waiting if id(req) not in later]
    if demand and tracker.limited:
        demand = tracker.within_limits(demand)
    if reconcile or (replan_waiting and demand):
        actions = tracker.reconcile(demand, now)  # a new list
    else:
        actions = []
        actions.extend(tracker.take_retired())  # a session switch in a claim above
    return _new(PassResult, (leases, waiting, actions))
