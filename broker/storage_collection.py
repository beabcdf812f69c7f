"""Storage collection: packages nothing references, and job logs past result retention.

Packages (any ``PackageStore``: local disk, memory, S3). ``collect(now)`` lists the store,
takes the packages stored longer than the grace period (``Settings.package_grace_s``) and asks
the job store which of them may go (``JobStore.forget_packages``: no function version names
one, none was deleted within the grace period, no job still to run needs one, none was
uploaded within it, no upload hold on one is unexpired); their rows are deleted in that one
write, then their bytes. So a package is gone once the grace period has passed since the
latest of when it was stored, last uploaded, and its last version deleted; a package a live
version names never is.

Safety against what runs at the same time, in this broker (one broker per store:
``broker.exclusive``): registrations and uploads through the broker take the digests they
name with ``DigestGuard.using``; collection skips a digest in use and holds uploads and
registrations of the digests it is deleting off until their bytes are gone. So an upload
either finishes first (then its ``last_uploaded`` keeps the package) or starts after the
bytes are gone (and stores them again), and a registration either commits first (its
version keeps the package) or finds the package gone. An upload straight to an object store
(a presigned PUT) is recorded as a hold (``JobStore.hold_package``) when the broker
authorises it, before any byte is sent.

Logs. Outputs past retention are expired by ``broker.sweeps``' retention loop, which deletes
their logs as it goes; ``delete_expired_logs`` also removes any log whose job has expired or
no longer exists (one left by a broker stopped between the two). Event-loop only; blocking
store calls go to threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass

from broker.lifecycle import LogArchive
from broker.store import JobStore
from functions.stores import PackageStore

log = logging.getLogger("firepool.broker")

COLLECT_BATCH = 500
"""Most packages forgotten in one job-store write."""


class DigestGuard:
    """Keeps collection off the digests uploads and registrations are using, and those off
    the digests being collected. Event-loop only (no lock needed: nothing here awaits between
    a check and its update)."""

    def __init__(self) -> None:
        self._using: Counter[str] = Counter()
        self._collecting: dict[str, asyncio.Event] = {}

    @contextlib.asynccontextmanager
    async def using(self, *digests: str | None) -> AsyncIterator[None]:
        """Hold ``digests`` (None entries ignored) in use for the block, waiting first for any
        of them being collected to be gone."""
        wanted = [d for d in digests if d is not None]
        while busy := [self._collecting[d] for d in wanted if d in self._collecting]:
            await busy[0].wait()
        self._using.update(wanted)
        try:
            yield
        finally:
            self._using.subtract(wanted)
            for digest in wanted:
                if self._using[digest] <= 0:
                    del self._using[digest]

    def start_collecting(self, digests: Iterable[str]) -> list[str]:
        """Of ``digests``, those not in use, now marked as being collected."""
        taken = [d for d in digests if d not in self._using and d not in self._collecting]
        for digest in taken:
            self._collecting[digest] = asyncio.Event()
        return taken

    def done_collecting(self, digests: Iterable[str]) -> None:
        """Let uploads and registrations of ``digests`` go on."""
        for digest in digests:
            event = self._collecting.pop(digest, None)
            if event is not None:
                event.set()


@dataclass(frozen=True, slots=True)
class Collected:
    """What one ``collect`` pass did."""

    packages: int
    """Packages deleted."""
    bytes: int
    """Their bytes."""
    kept: int
    """Packages past the grace period since stored that the job store kept (referenced,
    recently uploaded or deleted, or held)."""


class StorageCollector:
    def __init__(
        self,
        packages: PackageStore,
        store: JobStore,
        logs: LogArchive,
        grace_s: float,
        clock: Callable[[], float],
        guard: DigestGuard | None = None,
    ) -> None:
        self._packages = packages
        self._store = store
        self._logs = logs
        self._grace_s = grace_s
        self._clock = clock
        self.guard = guard or DigestGuard()
        """Uploads and registrations hold their digests here (``DigestGuard.using``)."""

    async def collect(self, now: float | None = None) -> Collected:
        """Delete every package that may go at ``now`` (the clock's time when None); see the
        module docstring for which."""
        now = self._clock() if now is None else now
        cutoff = now - self._grace_s
        stored = await asyncio.to_thread(
            lambda: {p.digest: p.size for p in self._packages.list() if p.stored_at <= cutoff}
        )
        deleted = freed = kept = 0
        candidates = list(stored)
        for start in range(0, len(candidates), COLLECT_BATCH):
            batch = self.guard.start_collecting(candidates[start : start + COLLECT_BATCH])
            try:
                going = await self._store.forget_packages(batch, now, self._grace_s)
                kept += len(batch) - len(going)
                for digest in going:
                    if await asyncio.to_thread(self._packages.delete, digest):
                        deleted += 1
                        freed += stored[digest]
            finally:
                self.guard.done_collecting(batch)
        if deleted:
            log.info("collected %d unreferenced packages (%d bytes)", deleted, freed)
        return Collected(deleted, freed, kept)

    async def delete_expired_logs(self) -> int:
        """Delete the archived log of every job that no longer exists or whose output has
        expired; returns how many."""
        names = await asyncio.to_thread(self._logs.job_ids)
        gone = 0
        for start in range(0, len(names), COLLECT_BATCH):
            batch = names[start : start + COLLECT_BATCH]
            retained = await self._store.retained_jobs(batch)
            for job_id in batch:
                if job_id not in retained:
                    await asyncio.to_thread(self._logs.delete, job_id)
                    gone += 1
        return gone
