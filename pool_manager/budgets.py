"""The per-accelerator budget ledger (paper §7): GPUs or CPU cores shared by every pool.

Units are reserved *before* a create is issued and released when the create fails or the
pod's group is deleted, so concurrent scaler passes can never overshoot a budget: the check
and the reservation are one step under the ledger's own lock. An accelerator with no budget
is unbounded. An active–standby group on one physical GPU holds one reservation, whatever
the number of pods on it.

Concurrency: every method takes the ledger's lock for a few dict operations; no I/O.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping


class BudgetLedger:
    """Reserved units per accelerator against a fixed budget."""

    __slots__ = ("_budgets", "_lock", "_used")

    def __init__(self, budgets: Mapping[str, int] | None = None) -> None:
        self._budgets: dict[str, int] = dict(budgets or {})
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()

    def reserve(self, accelerator: str, units: int) -> bool:
        """Reserve ``units`` if they fit under the budget; ``False`` (and nothing) otherwise."""
        with self._lock:
            used = self._used.get(accelerator, 0)
            budget = self._budgets.get(accelerator)
            if budget is not None and used + units > budget:
                return False
            self._used[accelerator] = used + units
            return True

    def force(self, accelerator: str, units: int) -> None:
        """Record units that already exist (restart, a pod we did not create) even past the
        budget: the ledger must reflect reality; the excess blocks further creates."""
        with self._lock:
            self._used[accelerator] = self._used.get(accelerator, 0) + units

    def release(self, accelerator: str, units: int) -> None:
        with self._lock:
            left = self._used.get(accelerator, 0) - units
            if left < 0:
                raise ValueError(f"ledger for {accelerator!r} released below zero")
            self._used[accelerator] = left

    def used(self, accelerator: str) -> int:
        with self._lock:
            return self._used.get(accelerator, 0)

    def budget(self, accelerator: str) -> int | None:
        return self._budgets.get(accelerator)

    def headroom(self, accelerator: str) -> int | None:
        """Units still free; ``None`` when unbounded."""
        with self._lock:
            budget = self._budgets.get(accelerator)
            if budget is None:
                return None
            return max(0, budget - self._used.get(accelerator, 0))

    def clear(self) -> None:
        """Forget every reservation (the tracker re-reserves all groups on restore)."""
        with self._lock:
            self._used.clear()

    def view(self) -> dict[str, tuple[int, int | None]]:
        """``{accelerator: (used, budget)}`` for /v1/pools and metrics."""
        with self._lock:
            names = set(self._used) | set(self._budgets)
            return {a: (self._used.get(a, 0), self._budgets.get(a)) for a in sorted(names)}
