"""The queued jobs' claim requests in dispatch order, grouped so a pass costs what changed.

Dispatch order is priority (higher first), then age (``queued_at``), then arrival. Requests
that differ only in ``job_id`` and ``queued_at`` form one *class*: the tracker cannot tell
them apart (``Tracker.claim`` reads every other field), and within one pass claims only take
pods away, so once one job of a class misses, every later job of that class misses too, for
the same reason. ``dispatch_pass`` therefore walks classes, not jobs: a heap of class heads in
dispatch order, claiming from a class until it misses; a backlog of 10,000 jobs from one
caller costs one miss per pass, not 10,000.

``Demand`` is what the pass hands the scaler: the waiting jobs that count as demand, as runs
of one class (a first request and a count). The scaler needs only sums per pool and caller;
per-caller limits (``CallerUsage.within_locked``) walk jobs in dispatch order, and only as
far as a limit lets them run.

Concurrency: none of its own; owned by one dispatcher (the event loop) or the simulator.
"""

from __future__ import annotations

import heapq
import itertools
from bisect import insort
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from pool_manager.model import ClaimRequest

Entry = tuple[float, int, ClaimRequest]
"""``(queued_at, arrival, request)``: one queued job; ascending in a class is dispatch order."""

ClassKey = tuple[str, str, "str | None", str, int, bool, int]
_COMPACT_AT = 64
"""A class drops its claimed head entries once this many (and half its list) are dead."""


def class_key(req: ClaimRequest) -> ClassKey:
    """Every field a claim reads: requests with equal keys are interchangeable to it."""
    return (req.caller, req.sku, req.lease_tag, req.queue, req.pods, req.single_use, req.priority)


class ClaimClass:
    """Queued requests of one class, ascending by ``(queued_at, arrival)``.

    Invariant: ``entries[head:]`` are the queued jobs; ``entries[:head]`` were taken by claims
    (dropped in bulk, so taking the first job is O(1))."""

    __slots__ = ("entries", "first", "head", "key", "order")

    def __init__(self, key: ClassKey, first: ClaimRequest, order: int) -> None:
        self.key = key
        self.first = first
        """A request of the class (any: they differ only in id and age); stands for all."""
        self.order = order
        """Tie-break between classes whose heads have equal dispatch keys (never happens for
        distinct arrivals; kept so heap entries never compare classes)."""
        self.entries: list[Entry] = []
        self.head = 0

    def __len__(self) -> int:
        return len(self.entries) - self.head

    def sort_key(self, i: int = 0) -> tuple[int, float, int]:
        """The dispatch key of the class's ``i``-th queued job (0: its head)."""
        queued_at, arrival, _ = self.entries[self.head + i]
        return (-self.first.priority, queued_at, arrival)

    def request(self, i: int = 0) -> ClaimRequest:
        return self.entries[self.head + i][2]

    def take_head(self) -> ClaimRequest:
        req = self.entries[self.head][2]
        self.head += 1
        if self.head >= _COMPACT_AT and 2 * self.head >= len(self.entries):
            del self.entries[: self.head]
            self.head = 0
        return req

    def insert(self, entry: Entry) -> None:
        live = self.entries
        if len(live) == self.head or entry[:2] >= live[-1][:2]:
            live.append(entry)  # the common case: the newest job of its class
        else:
            insort(live, entry, lo=self.head, key=lambda e: e[:2])

    def remove(self, job_id: str) -> ClaimRequest | None:
        live = self.entries
        for i in range(self.head, len(live)):
            if live[i][2].job_id == job_id:
                return live.pop(i)[2]
        return None


class DemandRun(NamedTuple):
    """``jobs`` jobs of one class, waiting and counted as demand: the first ``jobs``
    queued jobs of ``of`` (or, built from a plain list, ``jobs`` copies of ``req``)."""

    req: ClaimRequest
    jobs: int
    of: ClaimClass | None
    """The class whose first ``jobs`` jobs these are, for walks in dispatch order; ``None``
    for a run of a plain request list, whose order ``position`` gives."""
    position: int = 0


class Demand(list[DemandRun]):
    """Waiting jobs that count as demand, as runs of one class each (at most one run per
    class), in no particular order."""

    @classmethod
    def of(cls, requests: Iterable[ClaimRequest]) -> Demand:
        """One run per request, in order: a plain list (tests, a direct scaler call)."""
        return cls(DemandRun(req, 1, None, i) for i, req in enumerate(requests))

    def requests(self) -> Iterator[ClaimRequest]:
        """Every job, in dispatch order (O(jobs); for callers that need them one by one)."""
        return (req for _, _, req in merged_walk(self))


def merged_walk(
    runs: Sequence[DemandRun], stops: list[int] | None = None
) -> Iterator[tuple[int, DemandRun, ClaimRequest]]:
    """Each job of ``runs`` as ``(run index, run, request)``, in dispatch order. With
    ``stops``, the consumer may stop run ``n`` after a job by setting ``stops[n]`` negative:
    its later jobs are skipped (read before the run's next job is looked at)."""
    heap: list[tuple[tuple[int, float, int], int, int]] = [
        (_job_key(run, 0), n, 0) for n, run in enumerate(runs) if run.jobs
    ]
    heapq.heapify(heap)
    while heap:
        _, n, i = heap[0]
        run = runs[n]
        yield n, run, (run.req if run.of is None else run.of.request(i))
        if i + 1 < run.jobs and (stops is None or stops[n] >= 0):
            heapq.heapreplace(heap, (_job_key(run, i + 1), n, i + 1))
        else:
            heapq.heappop(heap)


def _job_key(run: DemandRun, i: int) -> tuple[int, float, int]:
    return (0, 0.0, run.position) if run.of is None else run.of.sort_key(i)


class ClaimQueue:
    """Every queued job's request, by class. ``push`` and ``remove`` keep dispatch order;
    ``dispatch_pass`` takes placed jobs off class heads (``ClaimClass.take_head``)."""

    __slots__ = ("_arrivals", "_classes", "_where")

    def __init__(self, requests: Iterable[ClaimRequest] = ()) -> None:
        self._classes: dict[ClassKey, ClaimClass] = {}
        self._where: dict[str, ClaimClass] = {}
        self._arrivals = itertools.count()
        for req in requests:
            self.push(req)

    def __len__(self) -> int:
        return len(self._where)

    def __bool__(self) -> bool:
        return bool(self._where)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._where

    def __iter__(self) -> Iterator[ClaimRequest]:
        """Every queued request in dispatch order (O(jobs · log classes))."""
        runs = [DemandRun(c.first, len(c), c) for c in self._classes.values()]
        return (req for _, _, req in merged_walk(runs))

    def push(self, req: ClaimRequest) -> None:
        """Queue ``req`` behind every queued job of its priority that is as old or older."""
        if req.job_id in self._where:
            raise ValueError(f"job {req.job_id!r} is already queued")
        key = class_key(req)
        cls = self._classes.get(key)
        if cls is None:
            cls = self._classes[key] = ClaimClass(key, req, len(self._classes))
        cls.insert((req.queued_at, next(self._arrivals), req))
        self._where[req.job_id] = cls

    def remove(self, job_id: str) -> ClaimRequest | None:
        """Take a queued job out (a cancel); ``None`` if it is not queued."""
        cls = self._where.pop(job_id, None)
        if cls is None:
            return None
        req = cls.remove(job_id)
        self._drop_if_empty(cls)
        return req

    def classes(self) -> list[ClaimClass]:
        """The classes with queued jobs (a new list; empty classes are dropped)."""
        return list(self._classes.values())

    def taken(self, cls: ClaimClass, req: ClaimRequest) -> None:
        """``req`` was taken off ``cls``'s head (placed): forget it."""
        del self._where[req.job_id]
        self._drop_if_empty(cls)

    def skus(self) -> set[str]:
        """The pools some queued job waits for (O(classes))."""
        return {cls.first.sku for cls in self._classes.values()}

    def _drop_if_empty(self, cls: ClaimClass) -> None:
        if not len(cls) and self._classes.get(cls.key) is cls:
            del self._classes[cls.key]
