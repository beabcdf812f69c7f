"""After an attempt: reset its pods, release them to the tracker, keep its logs.

The dispatcher resets after the outcome is committed (the agent keeps the result until it is
acknowledged, so a crash in between never runs the attempt twice). A one-pod job is answered
before its reset, and its session's next claim waits for the reset (``Tracker.resetting``),
so a caller's next step never finds its own pod still resetting. A pod is released
only after its agent reports a verified-clean reset; a pod that is lost or reports unclean is
released as unclean, which retires it, and is deleted, never reused. Logs are archived and
the attempt acknowledged afterwards, off the caller's path (a log read waits for that).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from broker.agent_client import AgentClient, AgentUnreachable
from broker.pods import PodManager, pool_of
from broker.telemetry import NO_TELEMETRY, Telemetry
from pool_manager.tracker import Tracker

log = logging.getLogger("firepool.lifecycle")


READ_CHUNK = 1 << 20
"""Most bytes of an archived log read at once (a 64 MiB log is streamed, never held whole)."""
INLINE_WRITE_BYTES = 64 * 1024
"""A log chunk this small is appended to its archive file on the event loop (a page-cache
write of microseconds, less than a worker thread's hand-off and back); a larger one in a
worker thread."""


class LogArchive:
    """Per-job log files under ``root`` (kept for the result-retention period)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def path(self, job_id: str) -> Path:
        return self.root / f"{job_id}.log"

    def write(self, job_id: str, data: bytes, offset: int) -> None:
        """Keep bytes ``offset``.. of an attempt's log, exactly as the job wrote them. A job's
        log is its last attempt's: an attempt's first bytes (``offset`` 0, even none) replace
        what an earlier attempt left, as a retry's live log starts again at offset 0."""
        if data or offset == 0:
            with self.path(job_id).open("ab" if offset else "wb") as f:
                f.write(data)

    def seal(self, job_id: str) -> None:
        """The job's log is whole (its attempt's archiving ended): here it stays in its file;
        ``broker.log_objects.ObjectLogArchive`` moves it to the object store."""

    def delete(self, job_id: str) -> None:
        """Forget the job's log (its result retention passed)."""
        self.path(job_id).unlink(missing_ok=True)

    def job_ids(self) -> list[str]:
        """The jobs whose logs are kept here (the storage sweep deletes those of jobs past
        retention: ``broker.storage_collection``). Blocks: call it from a worker thread."""
        return [path.name.removesuffix(".log") for path in self.root.glob("*.log")]

    def read(self, job_id: str, offset: int = 0, limit: int = READ_CHUNK) -> bytes:
        """Up to ``limit`` bytes of the archived log from byte ``offset`` (the agent's
        offsets: the same bytes)."""
        try:
            with self.path(job_id).open("rb") as f:
                f.seek(offset)
                return f.read(limit)
        except FileNotFoundError:
            return b""


class PodRecycler:
    def __init__(
        self,
        tracker: Tracker,
        pods: PodManager,
        agents: AgentClient,
        logs: LogArchive,
        clock: Callable[[], float],
        on_change: Callable[[], None],
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self.tracker = tracker
        self.pods = pods
        self.telemetry = telemetry
        self.agents = agents
        self.logs = logs
        self.clock = clock
        self.on_change = on_change
        self._archiving: dict[str, asyncio.Task[None]] = {}
        self._answered: dict[str, asyncio.Future[None]] = {}
        """Jobs answered before their reset whose ``archive`` has not begun (``answered``)."""

    async def reset(self, pods: list[str], lost: list[str]) -> bool:
        """Reset every reachable pod; True iff every pod reported a verified-clean reset."""
        results = await asyncio.gather(*(self._reset_one(pod) for pod in pods if pod not in lost))
        return not lost and all(results)

    def release(self, job_id: str, clean: bool) -> list[tuple[str, str]]:
        """Hand the pods back to the tracker: held for their owner, or retired. Returns the
        retired ones, ``(name, reason)``, for ``archive`` to delete once their logs are kept
        (the tracker already has them RETIRING: no job can claim them meanwhile).

        The owner itself was persisted before the first launch; the hold's timing is written
        off the caller's path (best-effort, paper A.1 step 4): a crash in between can only
        shorten a hold, never give the pod to another caller."""
        now = self.clock()
        retired: list[tuple[str, str]] = []
        for release in self.tracker.release(job_id, clean, now):
            if release.retire:
                retired.append((release.name, release.reason))
            else:
                pod = self.tracker.get(release.name)
                if pod is not None:
                    self.pods.annotate_later(release.name, ownership_annotations(pod))
        self.on_change()
        return retired

    def archive(
        self,
        job_id: str,
        pods: list[str],
        attempt_id: str,
        lost: list[str],
        retired: list[tuple[str, str]],
    ) -> None:
        """Off the caller's path: keep rank 0's logs, acknowledge the attempt on every pod
        (the agent keeps a result until then; the outcome is already committed), and only
        then delete the ``retired`` pods: deleted first, a single-use or recycled pod would
        take its job's logs with it."""
        task = asyncio.get_running_loop().create_task(
            self._archive(job_id, [p for p in pods if p not in lost], attempt_id, retired)
        )
        self._archiving[job_id] = task
        task.add_done_callback(partial(self._archived, job_id))

    def _archived(self, job_id: str, task: asyncio.Task[None]) -> None:
        """Forget a finished archiving task, unless a later attempt's has replaced it."""
        if self._archiving.get(job_id) is task:
            del self._archiving[job_id]

    def answered(self, job_id: str) -> None:
        """The job is answered before its pods' reset: until ``archive_begun``, a log read
        waits for the archive that follows rather than find none."""
        self._answered[job_id] = asyncio.get_running_loop().create_future()

    def archive_begun(self, job_id: str) -> None:
        """After ``archive`` (or instead of it, when the reset or release raised): the log
        reads ``answered`` held wait for the archiving task, if any, from now."""
        waiting = self._answered.pop(job_id, None)
        if waiting is not None:
            waiting.set_result(None)

    async def logs_settled(self, job_id: str) -> None:
        """Wait until the job's logs are archived (a log read right after the job ended)."""
        answered = self._answered.get(job_id)
        if answered is not None:
            await asyncio.shield(answered)
        task = self._archiving.get(job_id)
        if task is not None:
            await asyncio.wait({task})

    async def _archive(
        self, job_id: str, pods: list[str], attempt_id: str, retired: list[tuple[str, str]]
    ) -> None:
        try:
            for rank, pod in enumerate(pods):
                endpoint = self.pods.endpoints.get(pod)
                if endpoint is None:
                    continue
                try:
                    if rank == 0:
                        await self._keep_what_fits(job_id, endpoint, attempt_id)
                        if type(self.logs).seal is not LogArchive.seal:  # local: a no-op
                            await asyncio.to_thread(self.logs.seal, job_id)
                    await self.agents.ack(endpoint, attempt_id)
                except AgentUnreachable as exc:
                    log.info("pod %s unreachable while archiving %s: %s", pod, attempt_id, exc)
        finally:
            for name, reason in retired:
                self.pods.delete(name, reason)

    async def drain(self) -> None:
        while self._archiving:
            await asyncio.wait(set(self._archiving.values()))

    async def _keep_what_fits(self, job_id: str, endpoint: str, attempt_id: str) -> None:
        """``keep_logs``, where a log archive that cannot be written (its disk full) keeps
        what it took: the job's outcome is committed already, and its pods must still be
        acknowledged and released, so the broker serves on with the log cut short."""
        try:
            await self.keep_logs(job_id, endpoint, attempt_id)
        except OSError as exc:
            log.error("the log of %s could not be archived whole: %s", attempt_id, exc)

    async def keep_logs(self, job_id: str, endpoint: str, attempt_id: str) -> None:
        """Archive rank 0's log of ``attempt_id`` as the job's, from its start."""
        offset = 0
        # Bounded: the agent caps each attempt's log (pod_runtime.settings.MAX_LOG_BYTES,
        # 64 MiB unless a pod was started otherwise) and answers at most 1 MiB per call.
        for _ in range(1000):
            chunk = await self.agents.logs(endpoint, attempt_id, offset)
            if chunk is None:
                return
            if chunk.data or offset == 0:  # the first read even when empty: see ``write``
                if len(chunk.data) <= INLINE_WRITE_BYTES:
                    self.logs.write(job_id, chunk.data, offset)
                else:
                    await asyncio.to_thread(self.logs.write, job_id, chunk.data, offset)
            if not chunk.data:
                return
            offset = chunk.offset

    async def _reset_one(self, pod: str) -> bool:
        endpoint = self.pods.endpoints.get(pod)
        if endpoint is None:
            return False
        start = time.perf_counter()
        clean = False
        try:
            report = await self.agents.reset(endpoint)
            clean = bool(report.get("clean"))
            if not clean:
                log.warning(
                    "pod %s reset unclean: %s", pod, report.get("reason"),
                    extra={"event": "reset_unclean", "pod": pod, "pool": pool_of(pod)},
                )  # fmt: skip
        except AgentUnreachable as exc:
            log.warning(
                "pod %s unreachable during reset: %s", pod, exc,
                extra={"event": "reset_unreachable", "pod": pod, "pool": pool_of(pod)},
            )  # fmt: skip
        finally:
            self.telemetry.pod_reset(pool_of(pod), time.perf_counter() - start, clean)
        return clean


def ownership_annotations(pod: Any) -> dict[str, str | None]:
    """What a restarted broker needs to restore a pod's owner hold (paper A.1, A.3)."""

    def fmt(value: object) -> str | None:
        return None if value is None else str(value)

    return {
        "firepool/owner": fmt(pod.owner),
        "firepool/tag": fmt(pod.tag),
        "firepool/queue": fmt(pod.queue),
        "firepool/released-at": fmt(pod.released_at),
        "firepool/hold-until": fmt(pod.hold_until),
    }
