"""The broker's background loops, each on its own timer, each surviving its own failures.

- lock checks: keep this broker's locks (``BrokerLocks.check``); if another broker took one
  while it was lost, this one stops taking and dispatching jobs (fail closed: two dispatchers
  on one store run jobs twice) through ``on_lock_lost``;
- idle-pod checks: retire idle pods whose backend says they stopped, so a pod that died while
  idle is never handed to the next job (which would fail ``PodLost``);
- retention: expire outputs past the result retention and delete their logs;
- storage: collect packages past their grace period that nothing references, and delete
  any log left of a job past retention (``broker.storage_collection``);
- GPU exclusivity (paper A.4): re-verify each card; standby promotion stays off on a card
  until a successful read says only our pods use it, and after every restart.

All run on the event loop; blocking reads go to threads. ``stop`` cancels them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from broker.exclusive import BrokerLocks
from broker.lifecycle import LogArchive
from broker.pods import IDLE_CHECK_S, PodManager
from broker.settings import Settings
from broker.storage_collection import StorageCollector
from broker.store import JobStore
from pool_manager.backends.base import PodBackend
from pool_manager.tracker import Tracker

log = logging.getLogger("firepool.broker")

EXPIRE_BATCH = 1000
"""The store expires at most this many jobs a call; a full batch is followed at once."""


class Sweeps:
    def __init__(
        self,
        settings: Settings,
        locks: BrokerLocks,
        store: JobStore,
        tracker: Tracker,
        pods: PodManager,
        backend: PodBackend,
        logs: LogArchive,
        collector: StorageCollector,
        clock: Callable[[], float],
        wake: Callable[[], None],
        on_lock_lost: Callable[[str], None],
    ) -> None:
        self._settings = settings
        self._locks = locks
        self._store = store
        self._tracker = tracker
        self._pods = pods
        self._backend = backend
        self._logs = logs
        self._collector = collector
        self._clock = clock
        self._wake = wake
        self._on_lock_lost = on_lock_lost
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        loops: list[Coroutine[Any, Any, None]] = [
            self._lock_checks(),
            self._idle_pod_checks(),
            self._retention(),
            self._storage(),
            self._gpu_exclusivity(),
        ]
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(coro) for coro in loops]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _lock_checks(self) -> None:
        while True:
            await asyncio.sleep(self._settings.lock_check_s)
            try:
                taken = await asyncio.to_thread(self._locks.check)
            except Exception:
                log.exception("checking this broker's locks failed; trying again")
                continue
            if taken is not None:
                log.error("stopping: %s", taken)
                self._on_lock_lost(taken)
                return

    async def _idle_pod_checks(self) -> None:
        while True:
            await asyncio.sleep(IDLE_CHECK_S)
            try:
                await self._pods.retire_exited()
            except Exception:
                log.exception("checking idle pods failed; trying again")

    async def _retention(self) -> None:
        while True:
            await asyncio.sleep(self._settings.retention_sweep_s)
            try:
                while expired := await self._store.expire(self._clock(), limit=EXPIRE_BATCH):
                    for job_id in expired:
                        self._logs.delete(job_id)
                    if len(expired) < EXPIRE_BATCH:
                        break
            except Exception:
                log.exception("retention sweep failed")

    async def _storage(self) -> None:
        while True:
            await asyncio.sleep(self._settings.storage_sweep_s)
            try:
                await self._collector.collect()
                await self._collector.delete_expired_logs()
            except Exception:
                log.exception("storage sweep failed; trying again next time")

    async def _gpu_exclusivity(self) -> None:
        while True:
            gpus = sorted({p.gpu for p in self._tracker.pods() if p.gpu is not None})
            if gpus:
                try:
                    verdicts = await self._backend.sweep(gpus)
                except Exception:
                    log.exception("GPU exclusivity sweep failed; nothing changes this tick")
                    verdicts = {}
                now = self._clock()
                for gpu, exclusive in verdicts.items():
                    self._tracker.mark_gpu_verified(gpu, exclusive, now)
                if verdicts:
                    self._wake()
            await asyncio.sleep(self._settings.gpu_sweep_s)
