"""Arms (App. B.3): what differs between the runs of a paired repeat is only acquisition.

* ``reuse-on``: a stable reuse tag per caller, so each caller's steps share its warm pod;
* ``reuse-off``: a fresh tag per job with the tag as a retiring boundary (the pool's
  ``tag_mode`` is ``retire``): a job may run once on its caller's previous pod, which then
  retires, or land on an unheld idle or standby pod;
* ``fresh``: every job asks for a single-use pod (``ClaimRequest.single_use``), created for it
  and deleted at release; standbys are off, as a Kubernetes Job has none (a promoted standby
  is not a fresh pod);
* ``standby-on`` / ``standby-off``: a fresh tag per job (the standby benchmark, §9.3) with the
  pool's ``standbys_per_active`` at the venue's value or 0;
* ``ka<τ>``: reuse-on with keep-alive and owner hold ``τ`` s, floor 0, idle cap 0 (serverless
  TTL); ``f<floor>-c<cap>-ka<τ>``: the floor x idle-cap x keep-alive grid (C.1, Figure 6);
* ``shared``, ``per-env``, ``per-env-split``: the fragmentation study (Figure 5): one
  late-bound pool, a pool per environment each allowed the whole budget, or the budget split.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pool_manager.catalog import Catalog, PoolSpec
from simulator.venue import Venue


@dataclass(frozen=True, slots=True)
class Arm:
    name: str
    tag: str = "stable"
    """``stable`` (one tag per caller) or ``fresh`` (a new tag per job)."""
    single_use: bool = False
    standby: bool = True
    """Keep the venue's standbys per active; ``False`` sets 0."""
    pool: Mapping[str, Any] = field(default_factory=dict)
    """``PoolSpec`` overrides (keep-alive, floor, idle cap)."""
    per_env: str | None = None
    """``None``: one shared pool; ``budget``: a pool per environment, each up to the budget;
    ``split``: a pool per environment with the budget split evenly."""


_FIXED = {
    "reuse-on": Arm("reuse-on"),
    "reuse-off": Arm("reuse-off", tag="fresh"),
    "fresh": Arm("fresh", tag="fresh", single_use=True, standby=False),
    "standby-on": Arm("standby-on", tag="fresh"),
    "standby-off": Arm("standby-off", tag="fresh", standby=False),
    "shared": Arm("shared"),
    "per-env": Arm("per-env", per_env="budget"),
    "per-env-split": Arm("per-env-split", per_env="split"),
}
_GRID = re.compile(r"^(?:f(?P<floor>\d+)-c(?P<cap>\d+)-)?ka(?P<ka>\d+(?:\.\d+)?)$")


def parse_arm(name: str) -> Arm:
    arm = _FIXED.get(name)
    if arm is not None:
        return arm
    m = _GRID.fullmatch(name)
    if m is None:
        known = ", ".join([*_FIXED, "ka<s>", "f<floor>-c<cap>-ka<s>"])
        raise ValueError(f"unknown arm {name!r}; known: {known}")
    ka = float(m["ka"])
    knobs = {
        "idle_timeout_s": ka,
        "caller_hold_s": None,
        "min_count": int(m["floor"] or 0),
        "max_idle_count": int(m["cap"] or 0),
    }
    return Arm(name, pool=knobs)


def arm_names(spec: str) -> list[Arm]:
    """The arms of a comma-separated list, in order. Raises ``ValueError`` for an unknown
    arm or one named twice (its paired effect against itself would be meaningless)."""
    arms = [parse_arm(n.strip()) for n in spec.split(",") if n.strip()]
    seen: set[str] = set()
    for arm in arms:
        if arm.name in seen:
            raise ValueError(f"arm {arm.name!r} is named twice in {spec!r}")
        seen.add(arm.name)
    return arms


def env_sku(venue: Venue, arm: Arm, env: int) -> str:
    return venue.sku if arm.per_env is None else f"{venue.sku}-e{env}"


def build_catalog(venue: Venue, arm: Arm, envs: int = 1) -> Catalog:
    """The catalog one run of ``arm`` uses: the venue's pool with the arm's knobs."""
    knobs: dict[str, Any] = dict(arm.pool)
    if not arm.standby:
        knobs["standbys_per_active"] = 0
    base: PoolSpec = venue.with_pool(**knobs).pool
    per_pod = max(1, base.units_per_pod)
    if arm.per_env is None:
        pools = {base.sku: base}
    else:
        cap = base.max_count
        if arm.per_env == "split":
            cap = max(1, venue.budget // per_pod // envs)
        pools = {}
        for e in range(envs):
            sku = f"{base.sku}-e{e}"
            pools[sku] = venue.with_pool(sku=sku, max_count=cap, **knobs).pool
    return Catalog(pools=pools, budgets={base.accelerator: venue.budget})
