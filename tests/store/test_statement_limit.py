"""A job record the store cannot take is refused before it is sent (``TooLarge``), on every
backend: on MySQL a statement over ``max_allowed_packet`` used to break the writer's
connection, and a finished job's outcome was never recorded (it stayed RUNNING)."""

from __future__ import annotations

import pytest

from broker.jobs import output_value
from broker.store import JobStore, StoreSettings, open_store
from broker.store.store import STATEMENT_OVERHEAD, sent_size
from functions.errors import TooLarge
from pool_manager.states import JobState
from tests.store.builders import make_job

LIMIT = 200_000


async def _running(store: JobStore) -> tuple[str, int]:
    job = make_job()
    await store.submit(job)
    job.state = JobState.RUNNING
    await store.update(job, job.revision)
    return job.id, job.revision


def test_the_sent_size_counts_each_escaped_quote_and_backslash() -> None:
    assert sent_size('{"a":"it\'s \\\\ é"}') == len('{"a":"it\'s \\\\ é"}'.encode()) + 4 + 1 + 2


async def test_a_record_over_the_limit_is_refused_and_nothing_changes(store_url: str) -> None:
    store = await open_store(store_url, settings=StoreSettings(max_statement_bytes=LIMIT))
    try:
        assert store.max_statement_bytes == LIMIT
        big = make_job(input="x" * LIMIT)
        with pytest.raises(TooLarge, match="the job's input would take"):
            await store.submit(big)
        assert await store.get_job(big.id) is None

        job_id, revision = await _running(store)
        job = await store.get_job(job_id)
        assert job is not None
        job.state = JobState.SUCCEEDED
        # 70,000 quotes: 140 kB of JSON text, but twice that once MySQL escapes it.
        job.output = '"' * 70_000
        with pytest.raises(TooLarge, match="the job's outcome would take"):
            await store.update(job, revision)
        stored = await store.get_job(job_id)
        assert stored is not None
        assert (stored.state, stored.revision) == (JobState.RUNNING, revision)
        job.output = "x" * 100_000
        await store.update(job, revision)
        done = await store.get_job(job_id)
        assert done is not None and output_value(done.output) == "x" * 100_000
    finally:
        await store.close()


@pytest.mark.mysql
async def test_mysql_takes_its_limit_from_max_allowed_packet_and_stays_connected(
    mysql_session_url: str,
) -> None:
    """The real failure: an output just over the server's packet is refused before it is
    sent, the connection keeps working, and one just under it is stored whole."""
    store = await open_store(mysql_session_url)
    try:
        packet = store.max_statement_bytes
        assert packet is not None and packet >= 1024 * 1024
        job_id, revision = await _running(store)
        job = await store.get_job(job_id)
        assert job is not None
        job.state = JobState.SUCCEEDED
        for over in (packet + 1, packet - STATEMENT_OVERHEAD):  # the server's limit; ours
            job.output = "y" * over
            with pytest.raises(TooLarge):
                await store.update(job, revision)
        # Within our limit (the other columns take some 20 bytes here): stored whole.
        job.output = "y" * (packet - STATEMENT_OVERHEAD - 100)
        await store.update(job, revision)
        stored = await store.get_job(job_id)
        assert stored is not None and stored.state is JobState.SUCCEEDED
        assert output_value(stored.output) == job.output
    finally:
        await store.close()
