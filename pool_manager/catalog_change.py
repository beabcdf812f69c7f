"""What a catalog reload may change while the broker runs (paper App. C.3, template rollout).

A reload swaps the whole catalog or nothing. The checks that need no live state are here
(``static_problems``); the tracker adds the ones that read its pods (``Tracker.swap_catalog``:
a removed pool with running jobs, a pool with pods changing its accelerator or units per pod).
Every refusal is a ``CatalogChangeRefused`` naming each problem; the old catalog serves on.
"""

from __future__ import annotations

from functions.errors import InvalidRequest
from pool_manager.catalog import Catalog


class CatalogChangeRefused(InvalidRequest):
    """A reloaded catalog the running broker cannot switch to; nothing changed."""


def static_problems(old: Catalog, new: Catalog) -> list[str]:
    """Changes only a restart applies: the GPU cards the local backend was built with
    (``gpus``)."""
    problems: list[str] = []
    if dict(old.gpus) != dict(new.gpus):
        problems.append(
            "gpus (the cards the local backend uses) changed: that takes a broker restart"
        )
    return problems
