"""A job's log as its caller reads it: live from rank 0's agent while the job runs, from the
archive once it has ended, at the same byte offsets either way.

Only the last attempt's log is archived (``LogArchive``); when a retry starts, a follower
is told so in one line and reads the new attempt's log from its offset 0. Runs on the event
loop; archive reads go to a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from broker.agent_client import AgentClient, AgentUnreachable
from broker.dispatcher import Dispatcher
from broker.jobs import Job
from broker.lifecycle import LogArchive, PodRecycler
from pool_manager.states import TERMINAL_JOB_STATES, JobState

SETTLE_WAIT_S = 60.0
"""Longest a log read waits for an ended job to be settled (its log archived)."""
FOLLOW_POLL_S = 0.25
"""How often a follower of a running job asks its agent for more."""


class JobLogs:
    def __init__(
        self,
        dispatcher: Dispatcher,
        endpoints: Mapping[str, str],
        agents: AgentClient,
        recycler: PodRecycler,
        archive: LogArchive,
        get_job: Callable[[str], Awaitable[Job | None]],
    ) -> None:
        self._dispatcher = dispatcher
        self._endpoints = endpoints
        self._agents = agents
        self._recycler = recycler
        self._archive = archive
        self._get_job = get_job

    async def live(self, job: Job, offset: int) -> bytes:
        """Rank 0's log of the running attempt from byte ``offset``; empty when it cannot be
        read (the attempt just ended: the archive has it then)."""
        attempt = job.attempts[-1] if job.attempts else None
        pod = attempt.pods[0] if attempt is not None and attempt.pods else None
        endpoint = self._endpoints.get(pod) if pod else None
        if attempt is None or endpoint is None:
            return b""
        try:
            chunk = await self._agents.logs(endpoint, attempt.id, offset)
        except AgentUnreachable:
            return b""
        return chunk.data if chunk else b""

    async def stream(self, job: Job, follow: bool) -> AsyncIterator[bytes]:
        """The log's bytes from offset 0; with ``follow``, until the job ends."""
        offset, attempt_id = 0, None
        while True:
            live = self._dispatcher.live.get(job.id)
            if live is not None and live.state in TERMINAL_JOB_STATES:
                # Ended but not yet settled (its outcome being recorded, its pods reset):
                # its log is archived once it is, which ``logs_settled`` then waits for.
                await self._dispatcher.wait(job.id, SETTLE_WAIT_S)
            current = await self._get_job(job.id) or job
            # The state as read now: ``current`` may be the dispatcher's live job, which an
            # ending attempt changes during the reads below; ending on that change would skip
            # the log's tail, which the archive then has.
            state = current.state
            running = state is JobState.RUNNING and bool(current.attempts)
            if running:
                attempt = current.attempts[-1].id
                if attempt_id is not None and attempt != attempt_id:
                    offset = 0
                    yield f"[firepool] attempt {attempt} follows; its log:\n".encode()
                attempt_id = attempt
                data = await self.live(current, offset)
            else:
                await self._recycler.logs_settled(job.id)
                data = await asyncio.to_thread(self._archive.read, job.id, offset)
            offset += len(data)
            if data:
                yield data
                if follow or not running:  # chunks of 1 MiB: the archive's rest is there
                    continue
            if not follow or state in TERMINAL_JOB_STATES:
                return
            await asyncio.sleep(FOLLOW_POLL_S)
