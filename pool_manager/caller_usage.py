"""Per-caller limits (paper A.1): each caller's leased pods and GPUs against its own ceilings.

The catalog's ``limits`` (everyone) and ``caller_limits`` (per caller) cap the pods and GPUs
one caller holds *leased* at once (assigned or running; held idle pods do not count). The
check and the count happen in the claim's locked step, so no two dispatchers overrun a
limit. A gang is checked as a whole.

Invariant: ``_pods[caller]`` / ``_gpus[caller]`` are the caller's live leased pods and their
GPUs (absent when zero). The tracker keeps them only when the catalog sets a limit
(``Catalog.has_limits``); otherwise no claim pays for them.

Concurrency: no lock of its own; every method assumes the owning ``Tracker``'s lock is held.
"""

from __future__ import annotations

from collections.abc import Mapping

from pool_manager.catalog import Catalog, PoolSpec
from pool_manager.claim_queue import Demand, DemandRun, merged_walk
from pool_manager.model import ClaimRequest
from pool_manager.pod_index import gpus_per_pod


class CallerUsage:
    """Leased pods and GPUs per caller, and the checks against ``catalog``'s limits."""

    __slots__ = ("_catalog", "_gpus", "_pods")

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._pods: dict[str, int] = {}
        self._gpus: dict[str, int] = {}

    def clear_locked(self) -> None:
        self._pods.clear()
        self._gpus.clear()

    def over_locked(self, req: ClaimRequest, spec: PoolSpec) -> str | None:
        """The limit ``req`` would pass on top of its caller's leases (a ``Miss`` reason:
        ``caller_pod_limit`` or ``caller_gpu_limit``), or ``None``."""
        caller = req.caller
        want = req.pods * gpus_per_pod(spec)
        return self._catalog.limits_for(caller).exceeded_by(
            self._pods.get(caller, 0) + req.pods,
            self._gpus.get(caller, 0) + want if want else 0,
        )

    def add_locked(self, caller: str, pods: int, gpus: int) -> None:
        """Add (or, negative, remove) leased pods and GPUs to a caller's running totals."""
        left = self._pods.get(caller, 0) + pods
        if left > 0:
            self._pods[caller] = left
        else:
            self._pods.pop(caller, None)
        if gpus:
            gleft = self._gpus.get(caller, 0) + gpus
            if gleft > 0:
                self._gpus[caller] = gleft
            else:
                self._gpus.pop(caller, None)

    def within_locked(self, demand: Demand, specs: Mapping[str, PoolSpec]) -> Demand:
        """The jobs of ``demand`` that their callers' limits would let run at once, walking
        each caller's jobs in dispatch order and counting its leases and the jobs before.

        A run of a caller without limits, or one that can pass none (no pod limit and no
        GPUs), is taken whole; otherwise the walk takes a run's jobs until the first that
        would pass a limit, and drops the run's rest (its jobs are alike, and the caller's
        count only grows): the walk costs the jobs its limits let through, not the queue."""
        out = Demand()
        limited: dict[str, list[DemandRun]] = {}
        limits_for = self._catalog.limits_for
        for run in demand:
            limits = limits_for(run.req.caller)
            spec = specs.get(run.req.sku)
            gpus = gpus_per_pod(spec) if spec is not None else 0
            if limits.max_pods is None and (limits.max_gpus is None or not gpus):
                out.append(run)
            else:
                limited.setdefault(run.req.caller, []).append(run)
        for caller, runs in limited.items():
            taken = self._walk_locked(caller, runs, specs)
            out.extend(run._replace(jobs=n) for run, n in zip(runs, taken, strict=True) if n)
        return out

    def _walk_locked(
        self, caller: str, runs: list[DemandRun], specs: Mapping[str, PoolSpec]
    ) -> list[int]:
        """How many of each run's first jobs ``caller``'s limits let through, in dispatch
        order across ``runs``."""
        exceeded_by = self._catalog.limits_for(caller).exceeded_by
        pods, gpus = self._pods.get(caller, 0), self._gpus.get(caller, 0)
        taken = [0] * len(runs)
        for n, _, req in merged_walk(runs, taken):
            spec = specs.get(req.sku)
            more = req.pods * gpus_per_pod(spec) if spec is not None else 0
            if exceeded_by(pods + req.pods, gpus + more if more else 0):
                taken[n] = -taken[n] - 1  # stops the run: later jobs of it pass too
                continue
            pods, gpus = pods + req.pods, gpus + more
            taken[n] += 1
        return [n if n >= 0 else -n - 1 for n in taken]
