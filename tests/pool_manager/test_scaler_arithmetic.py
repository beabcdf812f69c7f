"""The scaler's App. A.5 arithmetic, term by term, on hand-computed cases."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from pool_manager.scaler import terms
from pool_manager.snapshot import IdleGroup, PoolView
from tests.pool_manager.builders import make_spec

NOW = 1000.0
OLD, RECENT = IdleGroup(0.0, ("old",)), IdleGroup(900.0, ("recent",))  # keep-alive 300 s


@dataclass
class Case:
    name: str
    knobs: dict[str, Any]
    view: dict[str, Any]
    queued: int
    expect: dict[str, int]
    owners: dict[str, int] = field(default_factory=dict)
    headroom: int | None = None


CASES = [
    Case(
        "an empty pool is filled to its floor",
        {"min_count": 2},
        {},
        0,
        {"physical": 0, "floor_deficit": 2, "demand_deficit": 0, "add": 2, "remove": 0},
    ),
    Case(
        "a burst is capped by the step",
        {},
        {"idle": 1, "busy": 2},
        10,
        {"demand": 12, "eligible": 3, "physical": 3, "demand_deficit": 9, "add": 4},
    ),
    Case(
        "starting pods are supply: no second wave",
        {},
        {"starting": 3},
        3,
        {"demand": 3, "eligible": 3, "demand_deficit": 0, "add": 0, "remove": 0},
    ),
    Case(
        "held pods count toward the floor but are not supply for other callers",
        {"min_count": 2},
        {"held": 2, "held_by_owner": {"alice": 2}},
        1,
        {"eligible": 0, "physical": 2, "floor_deficit": 0, "demand_deficit": 1, "add": 1},
        owners={"bob": 1},
    ),
    Case(
        "a held pod matched by its owner's queued job counts as idle",
        {},
        {"held": 1, "held_by_owner": {"alice": 1}},
        1,
        {"idle": 1, "held": 0, "eligible": 1, "demand_deficit": 0, "add": 0},
        owners={"alice": 1},
    ),
    Case(
        "held pods fill the ceiling: the blocked demand may break holds",
        {"max_count": 3},
        {"held": 3, "held_by_owner": {"alice": 3}},
        2,
        {"physical": 3, "demand_deficit": 2, "add": 0, "blocked": 2},
        owners={"bob": 2},
    ),
    Case(
        "single-use pods occupy the ceiling but cannot satisfy the floor",
        {"min_count": 2, "max_count": 4},
        {"stale": 2, "single_use": 2},
        0,
        {"physical": 2, "floor_deficit": 2, "add": 2},
    ),
    Case(
        "old-template pods satisfy the floor until they retire",
        {"min_count": 2},
        {"stale": 2},
        0,
        {"physical": 2, "floor_deficit": 0, "add": 0},
    ),
    Case(
        "a gang in the queue counts all its pods",
        {},
        {"idle": 1},
        4,
        {"demand": 4, "eligible": 1, "demand_deficit": 3, "add": 3},
    ),
    Case(
        "scale-down removes only expired idle pods, never below the floor",
        {"min_count": 1, "max_idle_count": 0},
        {"idle": 3, "idle_groups": (OLD, OLD, RECENT)},
        0,
        {"idle_cap": 0, "retain": 1, "expired_idle": 2, "remove": 2},
    ),
    Case(
        "the floor holds even when everything idle has expired",
        {"min_count": 3, "max_idle_count": 0},
        {"idle": 3, "idle_groups": (OLD, OLD, OLD)},
        0,
        {"retain": 3, "expired_idle": 3, "remove": 0},
    ),
    Case(
        "the idle cap retains expired idle pods",
        {"max_idle_count": 2},
        {"idle": 3, "idle_groups": (OLD, OLD, OLD)},
        0,
        {"idle_cap": 2, "retain": 2, "remove": 1},
    ),
    Case(
        "queued demand retains idle pods against scale-down",
        {"max_idle_count": 0},
        {"idle": 2, "busy": 1, "starting": 1, "idle_groups": (OLD, OLD)},
        2,
        {"demand": 3, "eligible": 4, "add": 0, "retain": 1, "remove": 1},
    ),
    Case(
        "the global budget caps creation (headroom)",
        {},
        {},
        5,
        {"demand_deficit": 5, "add": 1},
        headroom=1,
    ),
    Case(
        "deletes in flight still fill the ceiling",
        {"max_count": 3},
        {"busy": 2, "retiring": 1},
        2,
        {"physical": 2, "demand_deficit": 2, "add": 0, "blocked": 1},
    ),
    Case(
        "held, starting, stale pods and a queued gang together",
        {"min_count": 2, "max_count": 10, "step": 8},
        {
            "starting": 1,
            "idle": 1,
            "held": 2,
            "busy": 2,
            "stale": 1,
            "single_use": 1,
            "held_by_owner": {"alice": 2},
        },
        4,
        {
            "demand": 6,
            "eligible": 4,
            "physical": 7,
            "floor_deficit": 0,
            "demand_deficit": 2,
            "add": 2,
            "idle_cap": 2,
            "retain": 3,
        },
        owners={"carol": 4},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_scaler_terms_match_the_hand_computed_case(case: Case) -> None:
    view = PoolView(spec=make_spec(**case.knobs), **case.view)
    got = terms(view, case.queued, case.owners, NOW, case.headroom)
    assert {k: getattr(got, k) for k in case.expect} == case.expect
