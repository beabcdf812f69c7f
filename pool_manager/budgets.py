"""The per-accelerator budget ledger (paper §7): GPUs or CPU cores shared by every pool.

Units are reserved *before* a create is issued and released when the create fails or the
pod's group is deleted, so concurrent scaler passes can never overshoot a budget: the check
and the reservation are one step under the ledger's own lock. An accelerator with no budget
is unbounded. An active–standby group on one physical GPU holds one reservation, whatever
the number of pods on it.

The ledger also integrates what it holds over time: ``held_unit_seconds`` is the GPU- or
core-seconds reserved per accelerator since the ledger was made (paper §9.4's held capacity:
busy, idle, owner-held, starting and terminating alike, from the create's reservation to the
deletion), read off ``clock`` at every change.

Concurrency: every method takes the ledger's lock for a few dict operations; no I/O.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping


class BudgetLedger:
    """Reserved units per accelerator against a fixed budget, and their time integral."""

    __slots__ = ("_area", "_budgets", "_clock", "_lock", "_since", "_used")

    def __init__(
        self, budgets: Mapping[str, int] | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        """``clock``: seconds, never decreasing (the simulator passes its virtual clock)."""
        self._budgets: dict[str, int] = dict(budgets or {})
        self._used: dict[str, int] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self._area: dict[str, float] = {}
        """Unit-seconds held per accelerator up to ``_since``."""
        self._since: dict[str, float] = {}

    def _advance_locked(self, accelerator: str) -> None:
        """Close the integral of ``accelerator`` up to now, before its units change."""
        now = self._clock()
        used = self._used.get(accelerator, 0)
        if used:
            held = used * (now - self._since[accelerator])
            self._area[accelerator] = self._area.get(accelerator, 0.0) + held
        self._since[accelerator] = now

    def reserve(self, accelerator: str, units: int) -> bool:
        """Reserve ``units`` if they fit under the budget; ``False`` (and nothing) otherwise."""
        with self._lock:
            used = self._used.get(accelerator, 0)
            budget = self._budgets.get(accelerator)
            if budget is not None and used + units > budget:
                return False
            self._advance_locked(accelerator)
            self._used[accelerator] = used + units
            return True

    def force(self, accelerator: str, units: int) -> None:
        """Record units that already exist (restart, a pod we did not create) even past the
        budget: the ledger must reflect reality; the excess blocks further creates."""
        with self._lock:
            self._advance_locked(accelerator)
            self._used[accelerator] = self._used.get(accelerator, 0) + units

    def release(self, accelerator: str, units: int) -> None:
        with self._lock:
            left = self._used.get(accelerator, 0) - units
            if left < 0:
                raise ValueError(f"ledger for {accelerator!r} released below zero")
            self._advance_locked(accelerator)
            self._used[accelerator] = left

    def held_unit_seconds(self) -> dict[str, float]:
        """``{accelerator: unit-seconds}`` held since the ledger was made, up to now: a
        counter (it never decreases, ``clear`` included), for metrics and benchmarks."""
        with self._lock:
            now = self._clock()
            out = dict(self._area)
            for accelerator, used in self._used.items():
                if used:
                    out[accelerator] = out.get(accelerator, 0.0) + used * (
                        now - self._since[accelerator]
                    )
            return out

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

    def set_budgets(self, budgets: Mapping[str, int]) -> None:
        """New budgets (a catalog reload). Reservations stay: units held past a lowered
        budget block creates until enough are released, as ``force`` does."""
        with self._lock:
            self._budgets = dict(budgets)

    def clear(self) -> None:
        """Forget every reservation (the tracker re-reserves all groups on restore); what was
        held until now stays in ``held_unit_seconds``."""
        with self._lock:
            for accelerator in list(self._used):
                self._advance_locked(accelerator)
            self._used.clear()

    def view(self) -> dict[str, tuple[int, int | None]]:
        """``{accelerator: (used, budget)}`` for /v1/pools and metrics."""
        with self._lock:
            names = set(self._used) | set(self._budgets)
            return {a: (self._used.get(a, 0), self._budgets.get(a)) for a in sorted(names)}
