"""Catalog reload without a restart (paper App. C.3): on SIGHUP, and when the catalog file
changes (a mounted ConfigMap: the kubelet swaps the file's content under the same path).

``CatalogReloader.reload`` reads the file, checks it (``Catalog.load``'s validation, the
changes only a restart applies, a removed pool's queued and running jobs) and hands it to
the tracker (``Tracker.swap_catalog``), then to the parts that read pool specs (pod manager,
function registry, the broker's own admission checks). A refused reload logs one error line
saying why and changes nothing: the old catalog serves on. A removed pool with queued or
running jobs is refused (no job is failed or stranded by a reload; drain the pool with
``max_count: 0`` and remove it once its jobs are done); one with only idle pods has them
deleted. A changed pool ``template`` is a rollout: the pool's pods become stale and retire
within its ``drain_budget`` (``pool_manager.scaler``).

The watch reads the file every ``catalog_poll_s`` seconds and reloads when its bytes
change, and retries a catalog refused for what runs now (a removed pool's jobs) until it
applies (comparing content, not mtime: a ConfigMap update swaps a symlink, and a rewrite in
the same second keeps the mtime). Concurrency: runs on the broker's event loop; one reload
at a time (``_lock``); the file is read and parsed in a worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from functions.errors import FirepoolError
from pool_manager.catalog import Catalog
from pool_manager.catalog_change import CatalogChangeRefused, static_problems
from pool_manager.states import JobState

if TYPE_CHECKING:
    from broker.service import Broker

log = logging.getLogger("firepool.broker.catalog")


def _digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class CatalogReloader:
    """Reloads ``path`` into ``broker``; see the module docstring."""

    def __init__(self, broker: Broker, path: Path, poll_s: float) -> None:
        self.broker = broker
        self.path = path
        self.poll_s = poll_s
        self._lock = asyncio.Lock()
        self._seen = _digest(path)
        """The content last loaded or refused: the watch reloads only when it changes."""
        self._task: asyncio.Task[None] | None = None
        self._waiting = False
        """The file's content was refused for what runs now: the watch retries it."""
        self.reloads = 0
        """Reloads applied since start."""
        self.refused = 0
        """Reloads refused since start (the old catalog kept serving)."""

    def start(self) -> None:
        if self.poll_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            digest = await asyncio.to_thread(_digest, self.path)
            if digest is None:
                continue
            if digest != self._seen:
                await self.reload("the catalog file changed")
            elif self._waiting:
                await self.reload("the catalog file changed", again=True)

    async def reload_quietly(self, why: str) -> None:
        """``reload`` for a background task (SIGHUP): its outcome is in the log."""
        await self.reload(why)

    async def reload(self, why: str, again: bool = False) -> bool:
        """Load the file and switch to it; ``False`` (logged, nothing changed) if refused.
        A catalog refused for what is running now (``CatalogChangeRefused``: a removed pool
        still has jobs) is retried by the watch every poll until it applies, as the file is
        what the operator wants; ``again``: such a retry, whose refusal is not logged anew.
        An invalid file is not retried until it changes."""
        async with self._lock:
            self._seen = await asyncio.to_thread(_digest, self.path)
            self._waiting = False
            try:
                catalog = await asyncio.to_thread(Catalog.load, self.path)
                await self._apply(catalog)
            except CatalogChangeRefused as exc:
                self._waiting = True
                if not again:
                    self.refused += 1
                    log.error("catalog reload (%s) refused; the old catalog serves on, and "
                              "the file is tried again every %g s: %s",
                              why, self.poll_s, exc.message)  # fmt: skip
                return False
            except FirepoolError as exc:
                self.refused += 1
                log.error("catalog reload (%s) refused; the old catalog serves on: %s",
                          why, exc.message)  # fmt: skip
                return False
            self.reloads += 1
            log.info("catalog reloaded (%s): pools %s", why, ", ".join(sorted(catalog.pools)))
            return True

    async def _apply(self, catalog: Catalog) -> None:
        broker = self.broker
        old = broker.catalog
        problems = static_problems(old, catalog)
        removed = set(old.pools) - set(catalog.pools)
        if removed:
            jobs = await broker.jobs.jobs_in_states({JobState.PENDING, JobState.QUEUED})
            waiting: dict[str, int] = {}
            for job in jobs:
                if job.sku in removed:
                    waiting[job.sku] = waiting.get(job.sku, 0) + 1
            problems.extend(
                f"pool {sku!r} is removed but {n} of its jobs are queued: it is removed "
                f"once they have run"
                for sku, n in sorted(waiting.items())
            )
        if problems:
            raise CatalogChangeRefused("; ".join(problems))
        broker.use_catalog(catalog)
