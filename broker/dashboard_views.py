"""What the operator's dashboard shows, read from the broker's own state: the pool report
(the same dict ``GET /v1/pools`` answers), the tracker's pods, the budget ledger and the job
store. Nothing here writes.

Pool rows are counted from the pool report itself, so a row's pod counts, queue and held
unit-seconds are the numbers ``/v1/pools`` gives at the same moment. Start latencies and the
warm-hit rate are counted from the job records of the last ``WINDOW_S`` (their ``submitted``,
``first_instruction`` and ``acquisition``), so they are what the jobs pages show.

Concurrency rule: every method runs on the broker's event loop; the store's reads run in its
worker threads; ``CapacityHistory`` is touched only on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import func, select

from broker.jobs import Job
from broker.store import JobStore
from broker.store.tables import functions, jobs
from pool_manager.budgets import BudgetLedger
from pool_manager.model import PodInfo
from pool_manager.states import JobState, PodState

WINDOW_S = 3600.0
"""The span the dashboard's rates, percentiles and plots cover: the last hour."""
PLOT_BUCKETS = 12
"""Start-latency points in the plot: one per five minutes of ``WINDOW_S``."""
SAMPLE_EVERY_S = 10.0
"""How often ``CapacityHistory`` records the units each accelerator holds."""
LAST_JOB_SCAN = 2000
"""Most recent jobs of a pool read to name each pod's last job (older ones are not named)."""
BUSY_STATES = (PodState.ASSIGNED, PodState.RUNNING)
WARM_ACQUISITION = '{"path":"warm"%'
"""A warm job's ``acquisition`` text, as ``broker.store.codec`` writes ``{"path": "warm",
"reason": ...}`` (``tests/gateway/test_dashboard_pages.py`` holds the two together)."""


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``ordered`` (ascending) by the nearest rank, or None if empty
    (the same rule as ``benchmarks.invoke.pct``)."""
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True, slots=True)
class StartStats:
    """A pool's jobs acquired in the window: how many, how many took a warm pod, and the
    submit → first-instruction seconds of those that started."""

    acquired: int = 0
    warm: int = 0
    starts: tuple[float, ...] = ()
    """Ascending."""

    @property
    def warm_hit_rate(self) -> float | None:
        return self.warm / self.acquired if self.acquired else None

    @property
    def p50_s(self) -> float | None:
        return percentile(self.starts, 0.5)

    @property
    def p90_s(self) -> float | None:
        return percentile(self.starts, 0.9)


@dataclass(frozen=True, slots=True)
class PoolRow:
    """One pool on the overview. ``warm``: idle active pods (``held`` of them kept for
    their owners); ``running``: pods assigned to or running a job."""

    sku: str
    accelerator: str
    warm: int
    held: int
    standby: int
    starting: int
    running: int
    queued: int
    stats: StartStats
    held_unit_seconds: float
    budget_used: int
    budget: int | None
    failing: dict[str, Any] | None


def pool_rows(report: dict[str, Any], stats: dict[str, StartStats]) -> list[PoolRow]:
    """The overview's rows from a pool report (``Broker.pool_report``) and the window's
    ``stats`` per pool."""
    rows = []
    for sku, pool in report["pools"].items():
        counts: Counter[str] = Counter()
        for key, n in pool["pods"].items():
            state, _, role = key.partition(":")
            if role == "standby":
                counts["standby"] += n
            elif state == PodState.IDLE:
                counts["warm"] += n
            elif state == PodState.STARTING:
                counts["starting"] += n
            elif state in BUSY_STATES:
                counts["running"] += n
        budget = report["budgets"].get(pool["accelerator"], {})
        rows.append(
            PoolRow(
                sku=sku,
                accelerator=pool["accelerator"],
                warm=counts["warm"],
                held=pool["held"],
                standby=counts["standby"],
                starting=counts["starting"],
                running=counts["running"],
                queued=pool["queued"],
                stats=stats.get(sku, StartStats()),
                held_unit_seconds=budget.get("held_unit_seconds", 0.0),
                budget_used=budget.get("used", 0),
                budget=budget.get("budget"),
                failing=pool["failing"],
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class PodRow:
    """One pod on a pool's page. ``hold_left_s``: seconds its owner hold still runs (an idle
    held pod only); ``last_job``: the job it runs, else the newest recent job it ran."""

    pod: PodInfo
    age_s: float
    hold_left_s: float | None
    last_job: str | None


@dataclass(frozen=True, slots=True)
class FunctionVersion:
    name: str
    version: int
    sku: str
    package_digest: str
    owner: str
    created: float


@dataclass(slots=True)
class FunctionUse:
    """A function's calls in the window by outcome; ``success_rate`` is over the calls that
    ended by the function (succeeded or failed: a cancel is the caller's)."""

    calls: int = 0
    succeeded: int = 0
    failed: int = 0
    versions: list[FunctionVersion] = field(default_factory=list)

    @property
    def success_rate(self) -> float | None:
        ended = self.succeeded + self.failed
        return self.succeeded / ended if ended else None


@dataclass(frozen=True, slots=True)
class Plot:
    """The last hour as points: ``starts`` is (bucket end, p50 start seconds or None) per
    bucket, ``held`` is (time, units held) per accelerator from ``CapacityHistory``."""

    since: float
    until: float
    starts: list[tuple[float, float | None]]
    held: dict[str, list[tuple[float, int]]]


class CapacityHistory:
    """The units (GPUs or CPU cores) each accelerator held, sampled every ``SAMPLE_EVERY_S``
    for the last ``WINDOW_S``: held capacity has no record in the job store, so it is kept
    here from the broker's start (a restart begins a new history)."""

    def __init__(self, ledger: BudgetLedger, clock: Callable[[], float]) -> None:
        self._ledger = ledger
        self._clock = clock
        self._samples: deque[tuple[float, dict[str, int]]] = deque(
            maxlen=int(WINDOW_S / SAMPLE_EVERY_S) + 1
        )

    def sample(self) -> None:
        used = {acc: used for acc, (used, _cap) in self._ledger.view().items()}
        self._samples.append((self._clock(), used))

    async def run(self) -> None:
        """Sample until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)

    def series(self, since: float) -> dict[str, list[tuple[float, int]]]:
        out: dict[str, list[tuple[float, int]]] = defaultdict(list)
        for at, used in self._samples:
            if at >= since:
                for acc, units in used.items():
                    out[acc].append((at, units))
        return dict(out)


class DashboardViews:
    """The dashboard's reads (``Broker.views``), each over the broker's parts it is given."""

    def __init__(
        self,
        store: JobStore,
        pods: Callable[[], list[PodInfo]],
        capacity: CapacityHistory,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._pods = pods
        self.capacity = capacity
        self._clock = clock

    async def _window_rows(self, since: float) -> list[tuple[Any, ...]]:
        """Per job submitted since ``since``: its pool, submit time, submit → first
        instruction seconds (None before it started), whether it was acquired and whether
        warm. The path is matched in the acquisition's JSON text as the store's codec writes
        it (orjson, compact, ``path`` first), so no row's JSON is parsed here."""
        c = jobs.c
        stmt = select(
            c.sku,
            c.submitted,
            (c.first_instruction - c.submitted).label("start"),
            c.acquisition.is_not(None).label("acquired"),
            c.acquisition.like(WARM_ACQUISITION).label("warm"),
        ).where(c.submitted >= since)
        return await self._store.select(stmt)

    async def start_stats(self) -> tuple[dict[str, StartStats], Plot]:
        """Per pool, its jobs of the window (``StartStats``), and the window's plot."""
        now = self._clock()
        since = now - WINDOW_S
        acquired: Counter[str] = Counter()
        warm: Counter[str] = Counter()
        starts: dict[str, list[float]] = defaultdict(list)
        buckets: list[list[float]] = [[] for _ in range(PLOT_BUCKETS)]
        width = WINDOW_S / PLOT_BUCKETS
        for sku, submitted, start, was_acquired, was_warm in await self._window_rows(since):
            if was_acquired:
                acquired[sku] += 1
                if was_warm:
                    warm[sku] += 1
            if start is not None:
                starts[sku].append(start)
                slot = min(PLOT_BUCKETS - 1, int((submitted - since) / width))
                buckets[max(0, slot)].append(start)
        stats = {
            sku: StartStats(acquired[sku], warm[sku], tuple(sorted(starts[sku])))
            for sku in acquired.keys() | starts.keys()
        }
        points = [
            (since + (i + 1) * width, percentile(sorted(b), 0.5)) for i, b in enumerate(buckets)
        ]
        return stats, Plot(since, now, points, self.capacity.series(since))

    async def pool_pods(self, sku: str) -> list[PodRow]:
        """Every tracked pod of ``sku`` (none for an unknown pool), oldest first."""
        now = self._clock()
        mine = sorted((p for p in self._pods() if p.sku == sku), key=lambda p: p.created)
        last = await self._last_jobs(sku) if mine else {}
        rows = []
        for p in mine:
            hold = None
            if p.state is PodState.IDLE and p.hold_until is not None and p.hold_until > now:
                hold = p.hold_until - now
            rows.append(PodRow(p, now - p.created, hold, p.job_id or last.get(p.name)))
        return rows

    async def _last_jobs(self, sku: str) -> dict[str, str]:
        """Pod name → the newest of the pool's last ``LAST_JOB_SCAN`` jobs that ran on it."""
        c = jobs.c
        stmt = (
            select(c.id, c.attempts)
            .where(c.sku == sku, c.submitted >= self._clock() - WINDOW_S)
            .order_by(c.submitted.desc())
            .limit(LAST_JOB_SCAN)
        )
        last: dict[str, str] = {}
        for job_id, attempts in await self._store.select(stmt):
            for attempt in orjson.loads(attempts):
                for pod in attempt["pods"]:
                    last.setdefault(pod, job_id)
        return last

    async def find_jobs(
        self,
        function: str | None,
        caller: str | None,
        states: Collection[JobState] | None,
        limit: int,
    ) -> list[Job]:
        """Job summaries matching every filter given, newest first, without outputs."""
        return await self._store.list_jobs(
            function=function, caller=caller, states=states, limit=limit, output_budget=0
        )

    async def function_uses(self) -> dict[str, FunctionUse]:
        """Every live function name → its live versions (newest first) and its calls in the
        window by outcome."""
        f = functions.c
        stmt = (
            select(f.name, f.version, f.sku, f.package_digest, f.owner, f.created)
            .where(f.deleted.is_(False))
            .order_by(f.name, f.version.desc())
        )
        uses: dict[str, FunctionUse] = {}
        for row in await self._store.select(stmt):
            version = FunctionVersion(*row)
            uses.setdefault(version.name, FunctionUse()).versions.append(version)
        c = jobs.c
        calls = (
            select(c.function, c.state, func.count().label("n"))
            .where(c.submitted >= self._clock() - WINDOW_S)
            .group_by(c.function, c.state)
        )
        for function, state, n in await self._store.select(calls):
            use = uses.get(function)
            if use is None:  # a deleted function's calls
                continue
            use.calls += n
            if state == JobState.SUCCEEDED:
                use.succeeded += n
            elif state == JobState.FAILED:
                use.failed += n
        return uses


def start_sampler(capacity: CapacityHistory) -> asyncio.Task[None]:
    """``capacity.run`` as a task of the running loop (``stop_sampler`` ends it)."""
    return asyncio.get_running_loop().create_task(capacity.run(), name="capacity-history")


async def stop_sampler(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
