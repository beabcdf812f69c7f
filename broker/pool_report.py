"""What ``GET /v1/pools`` reports: per pool, its pods by state and role, the pods held for
their owners, queued demand, the scaler's bounds and a pool's failing creates; per
accelerator, the budget used and the capacity held.

Pure reads of the tracker, the dispatcher's queue and the budget ledger, on the event loop
(the tracker's lock makes each read consistent on its own; the report as a whole is a
moment's view, not a transaction).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from broker.jobs import Job
from broker.pods import CreateFailures
from pool_manager.budgets import BudgetLedger
from pool_manager.catalog import Catalog
from pool_manager.model import PodInfo
from pool_manager.states import PodState


def pool_report(
    catalog: Catalog,
    pods: Sequence[PodInfo],
    queued: Sequence[Job],
    ledger: BudgetLedger,
    failing: Mapping[str, CreateFailures],
    now: float,
    loop_now: float,
) -> dict[str, Any]:
    """The report for ``catalog``'s pools. ``now`` is the wall clock (holds expire on it);
    ``loop_now`` the event loop's clock (a failing pool's next create is timed on it)."""
    demand: Counter[str] = Counter()
    for job in queued:
        demand[job.sku] += job.pods_needed
    out: dict[str, Any] = {}
    for sku, pool in catalog.pools.items():
        mine = [p for p in pods if p.sku == sku]
        by_state = Counter(f"{p.state}:{p.role}" for p in mine)
        out[sku] = {
            "accelerator": pool.accelerator,
            "pods": dict(by_state),
            "held": sum(
                1
                for p in mine
                if p.hold_until is not None and p.hold_until > now and p.state is PodState.IDLE
            ),
            "queued": demand[sku],
            "floor": pool.min_count,
            "ceiling": pool.max_count,
            "idle_cap": pool.max_idle_count,
            "failing": _failing(failing.get(sku), loop_now),
        }
    held = ledger.held_unit_seconds()
    budgets = {
        acc: {"used": used, "budget": cap, "held_unit_seconds": round(held.get(acc, 0.0), 3)}
        for acc, (used, cap) in ledger.view().items()
    }
    return {"pools": out, "budgets": budgets}


def pod_list(pods: Sequence[PodInfo]) -> list[dict[str, Any]]:
    """Every pod, one record each (``GET /v1/pools?pods=1``)."""
    return [
        {
            "name": p.name,
            "sku": p.sku,
            "state": str(p.state),
            "role": p.role,
            "gpu": p.gpu,
            "owner": p.owner,
            "tag": p.tag,
            "queue": p.queue,
            "job": p.job_id,
            "created": p.created,
            "released_at": p.released_at,
            "hold_until": p.hold_until,
        }
        for p in pods
    ]


def _failing(failing: CreateFailures | None, loop_now: float) -> dict[str, Any] | None:
    """A pool's pods failing to start in a row (``PodManager.create_failures``), or None."""
    if failing is None:
        return None
    retry_in = failing.until - loop_now
    return {
        "in_a_row": failing.count,
        "last_error": failing.last_error,
        "next_create_in_s": round(max(0.0, retry_in), 3),
    }
