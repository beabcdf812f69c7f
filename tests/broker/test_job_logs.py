"""A followed log ends only once the job's end is read, and then with the archive's tail: a
job that ends while its live log is being read (the dispatcher's live job changes under the
reader) is not cut short.

The dispatcher, agent client, recycler and archive here are stand-ins with the few methods
``JobLogs`` calls (a real broker cannot stop its job between two awaits of the reader)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from broker.agent_client import LogChunk
from broker.job_logs import JobLogs
from broker.jobs import Attempt, Job
from pool_manager.states import JobState

HEAD, TAIL = b"line 1\n", b"line 2\n"


async def test_a_job_ending_during_a_live_read_is_followed_to_its_archived_tail() -> None:
    job = Job(id="j", function="f", version=1, caller="c", sku="cpu", input=None)
    job.move_to(JobState.RUNNING)
    job.attempts.append(Attempt(id="j:0", pods=["pod"]))
    live: dict[str, Job] = {"j": job}

    async def agent_logs(endpoint: str, attempt_id: str, offset: int) -> LogChunk:
        if offset == 0:
            return LogChunk(HEAD, len(HEAD), False)
        job.move_to(JobState.SUCCEEDED)  # the attempt ends while the reader awaits
        return LogChunk(b"", offset, True)

    async def wait(job_id: str, timeout: float) -> Job:
        live.pop(job_id, None)
        return job

    async def get_job(job_id: str) -> Job | None:
        return live.get(job_id, job)

    async def settled(job_id: str) -> None:
        return None

    def archived(job_id: str, offset: int) -> bytes:
        return (HEAD + TAIL)[offset:]

    dispatcher: Any = SimpleNamespace(live=live, wait=wait)
    agents: Any = SimpleNamespace(logs=agent_logs)
    recycler: Any = SimpleNamespace(logs_settled=settled)
    archive: Any = SimpleNamespace(read=archived)
    logs = JobLogs(dispatcher, {"pod": "unix:/nowhere"}, agents, recycler, archive, get_job)
    seen = b"".join([chunk async for chunk in logs.stream(job, follow=True)])
    assert seen == HEAD + TAIL
