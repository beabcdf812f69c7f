"""One dispatcher pass as a pure decision (paper §3, A.1 step 1; A.2 gangs; §7 scaling).

Given the queued requests in priority order, claim each job's full pod set from the tracker;
a job that cannot be placed is skipped, so smaller jobs behind it proceed, and becomes demand.
When there is demand (or a reconcile is due) expire holds and ask the scaler for actions.
The broker's dispatcher and the simulator both call exactly this; neither has its own copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from pool_manager.model import Action, ClaimRequest, Lease
from pool_manager.tracker import Tracker


@dataclass(slots=True)
class PassResult:
    leases: list[Lease] = field(default_factory=list)
    """Jobs placed this pass, in the order they were claimed."""
    waiting: list[ClaimRequest] = field(default_factory=list)
    """Jobs left queued (the demand handed to the scaler), order kept."""
    actions: list[Action] = field(default_factory=list)
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
    result = PassResult()
    for req in queued:
        claim = tracker.claim(req, now)
        if isinstance(claim, Lease):
            result.leases.append(claim)
        else:
            result.waiting.append(req)
    if reconcile or (replan_waiting and result.waiting):
        result.actions.extend(tracker.reconcile(result.waiting, now))
    else:
        result.actions.extend(tracker.take_retired())  # a session switch in a claim above
    return result
