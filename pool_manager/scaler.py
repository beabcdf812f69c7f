"""The queue-driven scaler (paper §7, App. A.5): ``plan(snapshot, demand, now, ledger)``.

Per pool, in whole groups (an active–standby group counts once, standbys are never extra
supply), with ``queued`` the pods of every job the dispatcher could not place this pass
(gangs count all their pods; jobs waiting on their caller's limit count too)::

    idle, held     held groups whose owner has queued jobs here count as idle (for that owner)
    demand         = queued + busy                      busy = assigned + running
    eligible       = starting + idle + busy
    physical       = eligible + held + stale            (retiring groups excluded)
    floorDeficit   = max(0, floor - (physical - singleUse))
    demandDeficit  = max(0, demand - eligible)
    add            = min(max(floorDeficit, demandDeficit), ceiling - (physical + retiring),
                         step, headroom)
    idleCap        = min(maxIdle, ceiling - (physical - idle))
    retain         = max(idleCap, floor - (held + busy), demand - (starting + busy))
    remove         = max(0, min(idle - retain, expiredIdle, physical - floor))  if add == 0

Counting deletes in flight: retiring groups still fill the ceiling (and the budget, until
``pod_gone``) but are not ``physical`` for the floor or scale-down, so a pass never deletes
twice and never waits a pass to replace a retiring pod. Creates in flight are ``starting``.

Hold breaking: when queued pods are blocked by the ceiling (``demandDeficit`` beyond
``ceiling - physical``), retire that many owner-held pods older than the minimum tenure,
oldest hold first, sparing owners with queued jobs. Idle old-template pods retire (up to
``step`` per pass); standby slots are staged on groups that have an active pod.

Each active ``CreatePod`` is reserved in the ledger before it is returned; when the ledger
refuses, the pass stops creating for that accelerator. Pure apart from the ledger.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pool_manager.budgets import BudgetLedger
from pool_manager.model import Action, ClaimRequest, CreatePod, DeletePod
from pool_manager.snapshot import PoolSnapshot, PoolView


@dataclass(frozen=True, slots=True)
class Terms:
    """Every term of one pool's pass, named as in App. A.5 (the table tests read these)."""

    queued: int
    demand: int
    starting: int
    idle: int
    held: int
    busy: int
    stale: int
    single_use: int
    retiring: int
    eligible: int
    physical: int
    floor_deficit: int
    demand_deficit: int
    add: int
    idle_cap: int
    retain: int
    expired_idle: int
    remove: int
    blocked: int


def terms(
    view: PoolView,
    queued: int,
    owner_queued: Mapping[str, int],
    now: float,
    headroom: int | None,
) -> Terms:
    """The A.5 arithmetic for one pool. ``headroom`` in pods; ``None`` = unbounded."""
    spec = view.spec
    floor, ceiling = spec.min_count, spec.max_count
    matched = sum(min(n, owner_queued.get(owner, 0)) for owner, n in view.held_by_owner.items())
    idle = view.idle + matched
    held = view.held - matched
    busy, starting = view.busy, view.starting
    demand = queued + busy
    eligible = starting + idle + busy
    physical = eligible + held + view.stale
    floor_deficit = max(0, floor - (physical - view.single_use))
    demand_deficit = max(0, demand - eligible)
    room = ceiling - (physical + view.retiring)
    add = min(max(floor_deficit, demand_deficit), room, spec.step)
    if headroom is not None:
        add = min(add, headroom)
    add = max(0, add)
    idle_cap = min(spec.max_idle_count, ceiling - (physical - idle))
    retain = max(idle_cap, floor - (held + busy), demand - (starting + busy))
    expired = sum(1 for g in view.idle_groups if g.since + spec.idle_timeout_s <= now)
    remove = 0 if add else max(0, min(idle - retain, expired, physical - floor))
    blocked = max(0, demand_deficit - max(0, ceiling - physical))
    return Terms(
        queued=queued, demand=demand, starting=starting, idle=idle, held=held, busy=busy,
        stale=view.stale, single_use=view.single_use, retiring=view.retiring,
        eligible=eligible, physical=physical, floor_deficit=floor_deficit,
        demand_deficit=demand_deficit, add=add, idle_cap=idle_cap, retain=retain,
        expired_idle=expired, remove=remove, blocked=blocked,
    )  # fmt: skip


def plan(
    snapshot: PoolSnapshot,
    demand: Sequence[ClaimRequest],
    now: float,
    ledger: BudgetLedger,
) -> list[Action]:
    """Creates and deletes for every pool, in a deterministic order (pools by name)."""
    queued: Counter[str] = Counter()
    by_owner: dict[str, Counter[str]] = {}
    waiting: set[str] = set()
    for req in demand:
        queued[req.sku] += req.pods
        if not req.single_use:  # a held pod is never clean enough for a single-use job
            by_owner.setdefault(req.sku, Counter())[req.caller] += req.pods
        waiting.add(req.caller)
    actions: list[Action] = []
    for sku in sorted(snapshot.pools):
        view = snapshot.pools[sku]
        spec = view.spec
        free = ledger.headroom(spec.accelerator)
        headroom = None if free is None else free // max(1, spec.units_per_pod)
        t = terms(view, queued[sku], by_owner.get(sku, Counter()), now, headroom)
        for _ in range(t.add):
            if not ledger.reserve(spec.accelerator, spec.units_per_pod):
                break
            actions.append(CreatePod(sku))
        expired = sorted(
            (g for g in view.idle_groups if g.since + spec.idle_timeout_s <= now),
            key=lambda g: (g.since, g.pods),
        )
        for group in expired[: t.remove]:
            actions.extend(DeletePod(name, "scale_down") for name in group.pods)
        actions.extend(DeletePod(name, "stale_template") for name in view.stale_idle[: spec.step])
        if t.blocked:
            breakable = sorted(
                (
                    h
                    for h in view.held_pods
                    if now - h.created >= spec.hold_min_tenure_s and h.owner not in waiting
                ),
                key=lambda h: (h.released_at, h.name),
            )
            actions.extend(DeletePod(h.name, "hold_broken") for h in breakable[: t.blocked])
        staged = 0
        for gpu, gap in view.standby_gaps:
            for _ in range(min(gap, spec.step - staged)):
                actions.append(CreatePod(sku, "standby", gpu))
                staged += 1
    return actions
