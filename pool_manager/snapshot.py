"""A point-in-time count of every pool, in the units the scaler reasons about (App. A.5).

Pods are counted by *group*: all pods pinned to one physical GPU count once (an active and
its standbys), a GPU-less pod counts alone. Each group falls in exactly one class, first
match wins:

``retiring``  every pod of the group is being deleted (a delete in flight)
``busy``      a pod of it is assigned or running a reusable job (``stale`` if that pod is
              single-use or of an old template: it will retire after the job)
``starting``  an active pod is starting (supply: a create in flight)
``stale``     its idle active pods are all single-use or of an old template
``idle``      it has a never-used idle active pod, or only standbys (promotable for the
              next job): unheld supply, removable by scale-down once its keep-alive expired
``held``      its idle active pods are all owner-held

``physical = starting + idle + held + busy + stale``; ``retiring`` groups still occupy the
ceiling and their budget units until they are gone.

``IdleGroup``, ``HeldPod``, ``PoolView`` and ``PoolSnapshot`` are ``NamedTuple``s (as
immutable as frozen dataclasses, which pay ``object.__setattr__`` per field: a 13-field
``PoolView`` cost more than classifying a small pool) and are built here with
``tuple.__new__``, in field order.

Pure. The tracker copies one ``PodRow`` tuple per pod under its lock (one C-level
``attrgetter`` call each) and classifies them here, after releasing it: at 100,000 pods the
lock is held for tens of milliseconds, not for the whole pass.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from operator import attrgetter
from types import MappingProxyType
from typing import Any, NamedTuple

from pool_manager.catalog import PoolSpec
from pool_manager.states import PodState


class PodRow(NamedTuple):
    """The fields of a ``PodInfo`` the scaler reads, copied under the tracker's lock."""

    name: str
    sku: str
    gpu: str | None
    role: str
    state: PodState
    owner: str | None
    template: str
    single_use: bool
    released_at: float | None
    created: float


#: ``row_of(pod)`` -> the ``PodRow`` fields of a ``PodInfo``, as a plain tuple.
row_of = attrgetter(*PodRow._fields)
_new = tuple.__new__  # NamedTuple construction without the Python shim (fields in order)

_NAME, _SKU, _GPU, _STATE, _OWNER, _TEMPLATE, _SINGLE_USE, _RELEASED_AT, _CREATED = map(
    PodRow._fields.index,
    ("name", "sku", "gpu", "state", "owner", "template", "single_use", "released_at", "created"),
)
_STARTING, _IDLE, _ASSIGNED, _RUNNING, _RETIRING, _DELETED = (
    PodState.STARTING, PodState.IDLE, PodState.ASSIGNED, PodState.RUNNING, PodState.RETIRING,
    PodState.DELETED,
)  # fmt: skip


class IdleGroup(NamedTuple):
    """An unheld idle group scale-down may remove: idle since ``since``; all its pods."""

    since: float
    pods: tuple[str, ...]


class HeldPod(NamedTuple):
    """An owner-held idle pod, for hold breaking."""

    name: str
    owner: str
    released_at: float
    created: float


class PoolView(NamedTuple):
    """One pool's group counts and the candidates the scaler may act on."""

    spec: PoolSpec
    starting: int = 0
    idle: int = 0
    held: int = 0
    busy: int = 0
    """Assigned + running (reusable jobs)."""
    stale: int = 0
    single_use: int = 0
    """The single-use part of ``stale`` (occupies the ceiling, cannot satisfy the floor)."""
    retiring: int = 0
    held_by_owner: Mapping[str, int] = MappingProxyType({})
    idle_groups: tuple[IdleGroup, ...] = ()
    held_pods: tuple[HeldPod, ...] = ()
    stale_idle: tuple[str, ...] = ()
    """Idle old-template pods, to retire (a template rollout)."""
    standby_gaps: tuple[tuple[str, int], ...] = ()
    """``(gpu, missing)`` standby slots to stage on groups with a live active pod."""

    @property
    def physical(self) -> int:
        return self.starting + self.idle + self.held + self.busy + self.stale


class PoolSnapshot(NamedTuple):
    """Every pool's view at ``now`` (in the catalog's order)."""

    now: float
    pools: Mapping[str, PoolView]


class _Acc:
    __slots__ = (
        "busy", "held", "held_by_owner", "held_pods", "idle", "idle_groups", "retiring",
        "single_use", "stale", "stale_idle", "standby_gaps", "starting",
    )  # fmt: skip

    def __init__(self) -> None:
        self.starting = self.idle = self.held = self.busy = 0
        self.stale = self.single_use = self.retiring = 0
        self.held_by_owner: dict[str, int] = {}
        self.idle_groups: list[IdleGroup] = []
        self.held_pods: list[HeldPod] = []
        self.stale_idle: list[str] = []
        self.standby_gaps: list[tuple[str, int]] = []


def build_snapshot(
    rows: Iterable[tuple[Any, ...]], specs: Mapping[str, PoolSpec], now: float
) -> PoolSnapshot:
    """Classify ``rows`` (``row_of(pod)`` tuples) into per-pool group counts.

    The rows stay plain tuples (indexed or unpacked in ``PodRow`` field order): building a
    ``PodRow`` per pod would cost more than classifying it. Groups keep the rows' order, so
    ``IdleGroup.pods`` and ``standby_gaps`` follow the tracker's pod order. Every pool of
    ``specs`` gets a view, in ``specs`` order (a pool without pods, all zeros)."""
    accs: dict[str, _Acc] = {}
    cards: dict[tuple[str, str], list[tuple[Any, ...]]] = {}
    for row in rows:
        if row[_STATE] is _DELETED:
            continue
        sku, gpu = row[_SKU], row[_GPU]
        if gpu is None:  # a GPU-less pod is a group of one
            acc = accs.get(sku)
            if acc is None:
                acc = accs[sku] = _Acc()
            _classify_one(acc, specs[sku], None, row)
            continue
        key = (sku, gpu)
        members = cards.get(key)
        if members is None:
            cards[key] = [row]
        else:
            members.append(row)
    for (sku, gpu), members in cards.items():
        acc = accs.get(sku)
        if acc is None:
            acc = accs[sku] = _Acc()
        if len(members) == 1:
            _classify_one(acc, specs[sku], gpu, members[0])
        else:
            _classify(acc, specs[sku], gpu, members)
    pools: dict[str, PoolView] = {}
    for sku, spec in specs.items():
        acc = accs.get(sku)
        if acc is None:  # no pods: every count zero
            pools[sku] = _new(PoolView, (spec, 0, 0, 0, 0, 0, 0, 0, {}, (), (), (), ()))
        else:
            pools[sku] = _view(spec, acc)
    return _new(PoolSnapshot, (now, pools))


def _classify_one(acc: _Acc, spec: PoolSpec, gpu: str | None, row: tuple[Any, ...]) -> None:
    """``_classify`` for a group of one pod (most groups), without the intermediate lists."""
    name, _, _, role, state, owner, template, single_use, released_at, created = row
    if state is _RETIRING:
        acc.retiring += 1
        return
    if gpu is not None and spec.standbys_per_active > 0 and role != "standby":
        acc.standby_gaps.append((gpu, spec.standbys_per_active))
    if state is _STARTING:
        acc.starting += 1
    elif role == "standby" and state is _IDLE:
        acc.idle += 1
        acc.idle_groups.append(_new(IdleGroup, (released_at or 0.0, (name,))))
    elif single_use or template != spec.template:  # stale
        acc.stale += 1
        acc.single_use += single_use
        if state is _IDLE and not single_use:
            acc.stale_idle.append(name)
    elif state is not _IDLE:
        acc.busy += 1
    elif owner is None:
        acc.idle += 1
        acc.idle_groups.append(_new(IdleGroup, (released_at or 0.0, (name,))))
    else:
        acc.held += 1
        acc.held_by_owner[owner] = acc.held_by_owner.get(owner, 0) + 1
        acc.held_pods.append(_new(HeldPod, (name, owner, released_at or 0.0, created)))


def _classify(acc: _Acc, spec: PoolSpec, gpu: str, members: list[tuple[Any, ...]]) -> None:
    """A group of several pods on one GPU, classified after one pass over its rows."""
    live: list[str] = []  # names of the members not retiring, in order
    leased: tuple[Any, ...] | None = None  # the first leased live member
    has_active = active_starting = False
    idle_actives: list[tuple[Any, ...]] = []
    idle_since: list[float] = []  # released_at of idle members (only standbys, if used)
    unowned = True  # no live member has an owner
    for row in members:
        name, _, _, role, state, owner, _, _, released_at, _ = row
        if state is _RETIRING:
            continue
        live.append(name)
        if owner is not None:
            unowned = False
        if state is _IDLE:
            idle_since.append(released_at or 0.0)
        elif leased is None and (state is _ASSIGNED or state is _RUNNING):
            leased = row
        if role != "standby":
            has_active = True
            if state is _IDLE:
                idle_actives.append(row)
            elif state is _STARTING:
                active_starting = True
    if not live:
        acc.retiring += 1
        return
    if has_active and spec.standbys_per_active > 0:
        gap = 1 + spec.standbys_per_active - len(live)
        if gap > 0:
            acc.standby_gaps.append((gpu, gap))
    if leased is not None:
        single_use = leased[_SINGLE_USE]
        if single_use or leased[_TEMPLATE] != spec.template:
            acc.stale += 1
            acc.single_use += single_use
        else:
            acc.busy += 1
        return
    if active_starting:
        acc.starting += 1
        return
    if idle_actives:
        _classify_idle(acc, spec, idle_actives, live if unowned else None)
        return
    if not idle_since:  # no idle member: its standbys are starting (or resetting)
        acc.starting += 1
        return
    acc.idle += 1  # a standby-only group: promotable for the next job
    acc.idle_groups.append(_new(IdleGroup, (max(idle_since), tuple(live))))


def _classify_idle(
    acc: _Acc, spec: PoolSpec, idle_actives: list[tuple[Any, ...]], unowned: list[str] | None
) -> None:
    """A group with idle active pods and nothing leased or starting: ``stale`` if they are
    all single-use or of an old template, else ``idle`` if one is never used (an
    ``IdleGroup`` of the ``unowned`` group's live pods, unless some pod of it has an
    owner), else ``held`` by the owner of the most recently released one."""
    template = spec.template
    all_stale = True
    stale_names: list[str] = []  # the stale ones not single-use
    any_single_use = False
    fresh_since: float | None = None  # the latest release of a fresh (never-used) pod
    held: list[tuple[Any, ...]] = []  # every one with an owner, stale or not
    for row in idle_actives:
        name, _, _, _, _, owner, row_template, single_use, released_at, _ = row
        if owner is not None:
            held.append(row)
        if single_use or row_template != template:
            any_single_use = any_single_use or bool(single_use)
            if not single_use:
                stale_names.append(name)
            continue
        all_stale = False
        if owner is None:
            since = released_at or 0.0
            if fresh_since is None or since > fresh_since:
                fresh_since = since
    if all_stale:
        acc.stale += 1
        acc.single_use += any_single_use
        acc.stale_idle.extend(stale_names)
        return
    if fresh_since is not None:
        acc.idle += 1
        if unowned is not None:
            acc.idle_groups.append(_new(IdleGroup, (fresh_since, tuple(unowned))))
        return
    acc.held += 1
    latest = max(held, key=_release_order)
    owner = latest[_OWNER] or ""
    acc.held_by_owner[owner] = acc.held_by_owner.get(owner, 0) + 1
    acc.held_pods.extend(
        _new(HeldPod, (row[_NAME], row[_OWNER] or "", row[_RELEASED_AT] or 0.0, row[_CREATED]))
        for row in held
    )


def _release_order(row: tuple[Any, ...]) -> tuple[float, str]:
    return (row[_RELEASED_AT] or 0.0, row[_NAME])


def _view(spec: PoolSpec, acc: _Acc) -> PoolView:
    return _new(
        PoolView,
        (
            spec, acc.starting, acc.idle, acc.held, acc.busy, acc.stale, acc.single_use,
            acc.retiring, acc.held_by_owner, tuple(acc.idle_groups), tuple(acc.held_pods),
            tuple(acc.stale_idle), tuple(acc.standby_gaps),
        ),
    )  # fmt: skip
