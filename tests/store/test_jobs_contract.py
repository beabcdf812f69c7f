"""Job records: durable round trip, compare-and-set revisions, legal transitions only."""

from __future__ import annotations

import asyncio
import dataclasses

import orjson
import pytest

from broker.jobs import Attempt, Job, JsonText, output_value
from broker.store import JobStore, StaleRevision, open_store
from broker.store.codec import MUTABLE_JOB_COLUMNS
from functions.errors import Conflict, NotFound
from pool_manager.states import IllegalTransition, JobState
from tests.store.builders import make_job


def full_job() -> Job:
    """A job with every field set to a non-default value."""
    return make_job(
        lease_tag="session-7",
        queue="rl",
        priority=5,
        timeout_s=12.5,
        max_retries=3,
        pods_needed=2,
        input={"prompt": "héllo ✓ 🚀", "nested": [1, 2.5, None, {"k": True}]},
        idempotency_key="key-1",
        request_hash="f" * 64,
    )


async def test_a_submitted_job_reads_back_with_every_field(store: JobStore) -> None:
    job = full_job()
    stored, created = await store.submit(job)
    assert created and stored is job
    assert await store.get_job(job.id) == job


async def test_an_update_persists_every_mutable_field(store: JobStore) -> None:
    job = full_job()
    await store.submit(job)
    job.state = JobState.RUNNING
    job.attempts = [Attempt(id=f"{job.id}:0", pods=["p-1", "p-2"], started=10.0)]
    job.acquisition = {"path": "warm", "reason": None}
    job.started = 10.0
    await store.update(job, 0)
    assert job.revision == 1
    job.state = JobState.FAILED
    job.output = JsonText('{"partial":[1,2]}')  # as the broker holds an output
    job.error = {"class": "NonZeroExit", "message": "exit 3"}
    job.exit_code = 3
    job.retries = 1
    job.attempts[0].exit_code = 3
    job.attempts[0].finished = 12.0
    job.attempts[0].error = {"class": "NonZeroExit", "message": "exit 3"}
    job.first_instruction = 10.5
    job.finished = 12.0
    await store.update(job, 1)
    assert job.revision == 2
    assert await store.get_job(job.id) == job
    assert set(MUTABLE_JOB_COLUMNS) >= {"state", "output", "error", "attempts", "acquisition"}


async def test_an_update_from_a_stale_copy_is_refused_and_writes_nothing(
    store: JobStore,
) -> None:
    job = make_job()
    await store.submit(job)
    winner = dataclasses.replace(job, state=JobState.RUNNING)
    loser = dataclasses.replace(job, state=JobState.CANCELLED)
    await store.update(winner, 0)
    with pytest.raises(StaleRevision) as caught:
        await store.update(loser, 0)
    assert isinstance(caught.value, Conflict)
    assert (caught.value.expected, caught.value.actual) == (0, 1)
    stored = await store.get_job(job.id)
    assert stored is not None and stored.state is JobState.RUNNING and stored.revision == 1
    assert loser.revision == 0


async def test_two_concurrent_writers_with_one_revision_exactly_one_wins(
    store: JobStore,
) -> None:
    job = make_job()
    await store.submit(job)
    copies = [dataclasses.replace(job, state=JobState.RUNNING) for _ in range(8)]
    results = await asyncio.gather(*(store.update(c, 0) for c in copies), return_exceptions=True)
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, StaleRevision) for r in results if r is not None)


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ([], JobState.SUCCEEDED),  # QUEUED -> SUCCEEDED skips RUNNING
        ([JobState.RUNNING, JobState.SUCCEEDED], JobState.RUNNING),  # terminal is final
        ([JobState.CANCELLED], JobState.QUEUED),
        ([JobState.RUNNING, JobState.FAILED], JobState.FAILED),  # no update of a terminal job
    ],
)
async def test_an_illegal_transition_is_rejected_and_writes_nothing(
    store: JobStore, path: list[JobState], illegal: JobState
) -> None:
    job = make_job()
    await store.submit(job)
    for state in path:
        job.state = state
        await store.update(job, job.revision)
    bad = dataclasses.replace(job, state=illegal, output="x")
    with pytest.raises(IllegalTransition):
        await store.update(bad, job.revision)
    assert await store.get_job(job.id) == job


async def test_a_field_update_within_a_live_state_is_allowed(store: JobStore) -> None:
    job = make_job(state=JobState.QUEUED)
    await store.submit(job)
    job.state = JobState.RUNNING
    await store.update(job, 0)
    job.first_instruction = 99.0
    await store.update(job, 1)
    job.state = JobState.QUEUED  # re-queued by restart recovery
    job.retries = 1
    await store.update(job, 2)
    assert await store.get_job(job.id) == job


async def test_pending_jobs_are_accepted_and_others_refused_at_submit(store: JobStore) -> None:
    pending = make_job(state=JobState.PENDING)
    assert (await store.submit(pending))[1]
    with pytest.raises(IllegalTransition):
        await store.submit(make_job(state=JobState.RUNNING))


async def test_updating_an_unknown_job_raises_not_found(store: JobStore) -> None:
    with pytest.raises(NotFound):
        await store.update(make_job(state=JobState.RUNNING), 0)


async def test_a_duplicate_job_id_is_a_conflict(store: JobStore) -> None:
    job = make_job()
    await store.submit(job)
    with pytest.raises(Conflict):
        await store.submit(dataclasses.replace(job, input="other"))


async def test_list_jobs_filters_and_returns_newest_first(store: JobStore) -> None:
    a1 = make_job(caller="a", function="f")
    b1 = make_job(caller="b", function="f")
    a2 = make_job(caller="a", function="g")
    a3 = make_job(caller="a", function="f", state=JobState.PENDING)
    for job in (a1, b1, a2, a3):
        await store.submit(job)
    ids = [j.id for j in await store.list_jobs()]
    assert ids == [a3.id, a2.id, b1.id, a1.id]
    assert [j.id for j in await store.list_jobs(caller="a")] == [a3.id, a2.id, a1.id]
    assert [j.id for j in await store.list_jobs(caller="a", function="f")] == [a3.id, a1.id]
    assert [j.id for j in await store.list_jobs(states=[JobState.QUEUED], limit=2)] == [
        a2.id,
        b1.id,
    ]


async def test_jobs_in_states_lists_oldest_first_and_survives_reopen(store_url: str) -> None:
    store = await open_store(store_url)
    try:
        jobs = [make_job() for _ in range(4)]
        for job in jobs:
            await store.submit(job)
        for job in jobs[:3]:
            job.state = JobState.RUNNING
            await store.update(job, 0)
        jobs[1].state = JobState.SUCCEEDED
        await store.update(jobs[1], 1)
    finally:
        await store.close()
    reopened = await open_store(store_url)
    try:
        running = await reopened.jobs_in_states([JobState.RUNNING])
        assert [j.id for j in running] == [jobs[0].id, jobs[2].id]
        live = await reopened.jobs_in_states([JobState.RUNNING, JobState.QUEUED])
        assert [j.id for j in live] == [jobs[0].id, jobs[2].id, jobs[3].id]
    finally:
        await reopened.close()


async def test_a_listing_leaves_out_inputs_and_the_outputs_past_its_budget(
    store: JobStore,
) -> None:
    """A caller's listing of a thousand jobs with 16 MiB outputs read them all (and every
    input) into the broker's memory; now it holds at most ``output_budget`` of outputs."""
    sizes = [300, 50, 200, 100]  # oldest first
    for n, size in enumerate(sizes):
        job = make_job(submitted=1000.0 + n, input={"n": n})
        await store.submit(job)
        job.state = JobState.RUNNING
        await store.update(job, 0)
        job.state = JobState.SUCCEEDED
        job.output = JsonText(orjson.dumps("x" * (size - 2)).decode())  # ``size`` characters
        await store.update(job, 1)
    listed = await store.list_jobs(output_budget=350)
    # Newest first: 100 fits, 200 fits (50 left), 50 fits, 300 does not.
    assert [output_value(j.output) for j in listed] == [
        "x" * 98, "x" * 198, "x" * 48, None,
    ]  # fmt: skip
    assert [j.output_omitted for j in listed] == [False, False, False, True]
    assert all(j.input is None for j in listed)
    full = await store.get_job(listed[-1].id)
    assert full is not None and full.input == {"n": 0} and not full.output_omitted
    assert output_value(full.output) == "x" * 298
    assert [j.output_omitted for j in await store.list_jobs()] == [False] * 4
