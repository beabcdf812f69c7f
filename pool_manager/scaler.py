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
oldest hold first, sparing owners with queued jobs. Idle old-template pods retire (a
template rollout), up to ``step`` per pass and only while the pool's retiring groups,
counting this pass's other deletes, stay under its ``drain_budget``; standby slots are
staged on groups that have an active pod. Old-template groups are ``stale``, part of
``physical``, so new-template pods replace them only as they go: a rollout never takes a
pool past its ceiling.

Each active ``CreatePod`` is reserved in the ledger before it is returned; when the ledger
refuses, the pass stops creating for that accelerator. Pure apart from the ledger.

Budget reclaim: when pools share an accelerator's budget and the pods they would add exceed
its headroom (less what retiring groups will free), the other pools on it scale down as if
their idle cap were 0, for idle groups past their keep-alive only (floors, owner holds and
their own demand still retain): the idle cap "retains but never pre-creates", so it must not
hold units another pool's queued jobs need, or those jobs could wait forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pool_manager.budgets import BudgetLedger
from pool_manager.claim_queue import Demand
from pool_manager.model import Action, ClaimRequest, CreatePod, DeletePod
from pool_manager.snapshot import IdleGroup, PoolSnapshot, PoolView


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
    timeout = view.spec.idle_timeout_s
    expired = sum(1 for g in view.idle_groups if g.since + timeout <= now)
    return Terms(*_arithmetic(view, queued, owner_queued, expired, headroom))


_ADD, _REMOVE, _BLOCKED = map(Terms.__match_args__.index, ("add", "remove", "blocked"))


def _arithmetic(
    view: PoolView,
    queued: int,
    owner_queued: Mapping[str, int],
    expired: int,
    headroom: int | None,
    keep_idle: bool = True,
) -> tuple[int, ...]:
    """``terms`` as a plain tuple in ``Terms`` field order (``plan`` reads three of them
    without building a ``Terms``); ``expired``: the idle groups past their keep-alive;
    ``keep_idle=False``: an idle cap of 0 (budget reclaim)."""
    # PoolView's first nine fields, in order (one unpack, not nine attribute lookups)
    spec, starting, idle, held, busy, stale, single_use, retiring, held_by_owner = view[:9]
    floor, ceiling = spec.min_count, spec.max_count
    if owner_queued:
        matched = 0
        for owner, n in held_by_owner.items():
            matched += min(n, owner_queued.get(owner, 0))
        idle += matched
        held -= matched
    demand = queued + busy
    eligible = starting + idle + busy
    physical = eligible + held + stale
    floor_deficit = max(0, floor - (physical - single_use))
    demand_deficit = max(0, demand - eligible)
    room = ceiling - (physical + retiring)
    add = min(max(floor_deficit, demand_deficit), room, spec.step)
    if headroom is not None:
        add = min(add, headroom)
    add = max(0, add)
    idle_cap = min(spec.max_idle_count, ceiling - (physical - idle)) if keep_idle else 0
    retain = max(idle_cap, floor - (held + busy), demand - (starting + busy))
    remove = 0 if add else max(0, min(idle - retain, expired, physical - floor))
    blocked = max(0, demand_deficit - max(0, ceiling - physical))
    return (
        queued, demand, starting, idle, held, busy, stale, single_use, retiring, eligible,
        physical, floor_deficit, demand_deficit, add, idle_cap, retain, expired, remove, blocked,
    )  # fmt: skip


_NO_OWNERS: Mapping[str, int] = {}
_NONE_EXPIRED: list[IdleGroup] = []  # never written: sorted only when something expired


def _queued_by_owner(demand: Demand) -> dict[str, dict[str, int]]:
    """Queued pods per SKU and caller, of the jobs a held pod could serve (reusable ones:
    a held pod is never clean enough for a single-use job)."""
    by_owner: dict[str, dict[str, int]] = {}
    for req, count, _, _ in demand:
        if not req.single_use:
            owners = by_owner.get(req.sku)
            if owners is None:
                by_owner[req.sku] = {req.caller: req.pods * count}
            else:
                owners[req.caller] = owners.get(req.caller, 0) + req.pods * count
    return by_owner


def next_keepalive_expiry(snapshot: PoolSnapshot, now: float) -> float:
    """The first time after ``now`` at which an unheld idle group passes its keep-alive
    (``expiredIdle`` grows), ``inf`` if none. With nothing queued this is the only term of
    ``plan`` that moves with time alone (hold breaking needs queued jobs), so a pass with no
    demand on the same snapshot and ledger plans the same before it."""
    soonest = float("inf")
    for view in snapshot.pools.values():
        timeout = view.spec.idle_timeout_s
        for group in view.idle_groups:
            at = group.since + timeout  # expired at ``now`` iff ``at <= now``, as in ``plan``
            if now < at < soonest:
                soonest = at
    return soonest


def _expired(view: PoolView, now: float) -> list[IdleGroup]:
    if not view.idle_groups:
        return _NONE_EXPIRED
    timeout = view.spec.idle_timeout_s
    return [g for g in view.idle_groups if g.since + timeout <= now]


_Grows = tuple[str, PoolView, list[IdleGroup], Mapping[str, int], int, tuple[int, ...]]
"""One pool's inputs to ``plan`` and its terms with no budget headroom applied: ``(sku, view,
expired idle groups, its queued owners, its queued pods, _arithmetic(...))``."""


def _budget_shortfall(
    grows: Sequence[_Grows], queued: Mapping[str, int], pools: Mapping[str, PoolView],
    ledger: BudgetLedger,
) -> dict[str, int]:  # fmt: skip
    """Units per accelerator that its pools with queued jobs would add this pass beyond the
    budget's headroom and what its retiring groups will free: what budget reclaim may free."""
    want: dict[str, int] = {}
    for sku, view, _, _, _, t in grows:
        if t[_ADD] and sku in queued:
            spec = view.spec
            want[spec.accelerator] = want.get(spec.accelerator, 0) + t[_ADD] * spec.units_per_pod
    short: dict[str, int] = {}
    for accelerator, units in want.items():
        free = ledger.headroom(accelerator)
        if free is None:
            continue
        freeing = sum(v.retiring * v.spec.units_per_pod for v in pools.values()
                      if v.spec.accelerator == accelerator)  # fmt: skip
        if units > free + freeing:
            short[accelerator] = units - free - freeing
    return short


def plan(
    snapshot: PoolSnapshot,
    demand: Demand | Sequence[ClaimRequest],
    now: float,
    ledger: BudgetLedger,
) -> list[Action]:
    """Creates and deletes for every pool, in a deterministic order (pools by name).
    ``demand``: the waiting jobs the scaler plans for (only their sums per pool and caller
    matter), as runs or a plain list."""
    if not isinstance(demand, Demand):
        demand = Demand.of(demand)
    queued: dict[str, int] = {}
    for req, count, _, _ in demand:
        queued[req.sku] = queued.get(req.sku, 0) + req.pods * count
    by_owner: dict[str, dict[str, int]] | None = None  # built once a pool has held pods
    actions: list[Action] = []
    pools = snapshot.pools
    grows: list[_Grows] = []  # every pool's terms first: budget reclaim needs them all
    for sku in sorted(pools) if len(pools) > 1 else pools:
        view = pools[sku]
        expired = _expired(view, now)
        owners = _NO_OWNERS
        if view.held_by_owner and sku in queued:
            if by_owner is None:
                by_owner = _queued_by_owner(demand)
            owners = by_owner.get(sku, _NO_OWNERS)
        n = queued.get(sku, 0)
        grows.append(
            (sku, view, expired, owners, n, _arithmetic(view, n, owners, len(expired), None))
        )
    short = _budget_shortfall(grows, queued, pools, ledger) if len(pools) > 1 else {}
    for sku, view, expired, owners, n, unbounded in grows:
        spec = view.spec
        accelerator, units = spec.accelerator, spec.units_per_pod
        t = unbounded
        # The headroom (>= 0) only caps ``add``: with no pod to add it changes no term, so
        # the ledger is asked (and, when it has a budget, locked) only when a pool would grow.
        if t[_ADD] and ledger.budget(accelerator) is not None:
            free = ledger.headroom(accelerator)
            if free is not None:
                t = _arithmetic(view, n, owners, len(expired), free // max(1, units))
        for _ in range(t[_ADD]):
            if not ledger.reserve(accelerator, units):
                break
            actions.append(CreatePod(sku))
        remove = t[_REMOVE]
        reclaim = 0
        if short.get(accelerator, 0) > 0 and not unbounded[_ADD] and len(expired) > remove:
            # Budget reclaim, in a pool that would not grow even with budget to spare (so
            # ``t`` is ``unbounded`` and ``remove`` never exceeds this): the idle cap alone
            # retains no expired group here.
            uncapped = _arithmetic(view, n, owners, len(expired), None, keep_idle=False)[_REMOVE]
            per = max(1, units)
            reclaim = min(uncapped - remove, -(-short[accelerator] // per))
            short[accelerator] -= reclaim * per
        if remove or reclaim:
            expired.sort(key=lambda g: (g.since, g.pods))
            for group in expired[:remove]:
                actions.extend(DeletePod(name, "scale_down") for name in group.pods)
            for group in expired[remove : remove + reclaim]:
                actions.extend(DeletePod(name, "budget_reclaim") for name in group.pods)
        if view.stale_idle:
            # Template rollout: old-template idle pods retire only while the pool's groups
            # retiring (in flight, plus the ones this pass just removed) stay under its
            # drain budget; the rest serve on until a retirement completes.
            drain = min(spec.step, spec.drain_budget - view.retiring - remove - reclaim)
            if drain > 0:
                actions.extend(
                    DeletePod(name, "stale_template") for name in view.stale_idle[:drain]
                )
        blocked = t[_BLOCKED]
        if blocked and view.held_pods:
            # Spared: owners with queued jobs this pod could serve (``owners``: reusable jobs
            # on this pool). A single-use job, or one on another pool, never reuses it, so
            # its owner's hold is broken like any other (sparing it would make the job wait
            # the hold out for nothing).
            tenure = spec.hold_min_tenure_s
            breakable = [
                h for h in view.held_pods if now - h.created >= tenure and h.owner not in owners
            ]
            if len(breakable) > 1:
                breakable.sort(key=lambda h: (h.released_at, h.name))
            actions.extend(DeletePod(h.name, "hold_broken") for h in breakable[:blocked])
        staged = 0
        for gpu, gap in view.standby_gaps:
            for _ in range(min(gap, spec.step - staged)):
                actions.append(CreatePod(sku, "standby", gpu))
                staged += 1
    return actions
