"""Between two runs of a carried-over campaign, switch the pool to the next arm's settings.

The paper's campaigns interleave arms on one pool (App. B.4), and the fresh-pod arm runs
without standbys while the reuse arms keep three per active (``arms.build_catalog``). An
operator changes a pool's settings by restarting the broker on the new catalog: the restart
rebuilds the tracker from the pods that exist (``Tracker.restore``, paper A.1) and the GPU
sweep re-verifies each card before any standby is promoted. This does the same to a
``Simulation`` between its warm-up and the measured run, so pods still starting, held for
their owner, idle or terminating carry over into the next arm, whatever its settings.

Pods the new settings would not have staged (standbys on a pool that now has none) stay
until the scaler's usual rules remove them; nothing is deleted by the switch itself.
"""

from __future__ import annotations

from contextlib import nullcontext

from pool_manager.budgets import BudgetLedger
from pool_manager.simulator.arms import Arm, build_catalog
from pool_manager.simulator.engine import _RELEASE, Job, Simulation
from pool_manager.tracker import Tracker


def reconfigure(sim: Simulation, arm: Arm) -> None:
    """Make ``arm`` the run's arm; if its catalog differs from the one ``sim`` runs, restart
    the tracker on the new one from ``sim``'s pods. Raises ``ValueError`` if the new catalog
    lacks a pool some pod belongs to (a per-environment arm after a shared one)."""
    catalog = build_catalog(sim.venue, arm, len(sim.skus))
    if catalog == sim.catalog:
        sim.arm = arm
        return
    pods = sim.tracker.pods()
    missing = sorted({p.sku for p in pods} - catalog.pools.keys())
    if missing:
        raise ValueError(f"arm {arm.name!r} has no pool {', '.join(missing)} to carry pods into")
    leased = {o.id: o.req for _, _, kind, o in sim.heap if kind == _RELEASE and isinstance(o, Job)}
    ledger = BudgetLedger(catalog.budgets)
    tracker = Tracker(catalog, ledger, lock=nullcontext())
    tracker.restore(pods, sim.now, leased)
    for card in sim.pod_card.values():  # the sweep: a dedicated node has only our shares
        tracker.mark_gpu_verified(card, True, sim.now)
    sim.arm, sim.catalog, sim.ledger, sim.tracker = arm, catalog, ledger, tracker
    sim.units = ledger.used(sim.acc)
    sim.floor_units = sum(s.min_count for s in catalog.pools.values())
    sim.quiet_since, sim.replan = -1.0, True
