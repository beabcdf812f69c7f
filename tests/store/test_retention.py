"""Retention: outputs expire after ``result_retention_s``; idempotency keys after theirs."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from broker.jobs import output_value
from broker.store import JobStore, StoreSettings, open_store
from broker.store.engine import make_engines
from pool_manager.states import JobState
from tests.store.builders import make_job

HOUR = 3600.0


async def finished_job(store: JobStore, finished: float, state: JobState) -> str:
    job = make_job(submitted=finished - 10)
    await store.submit(job)
    job.state = JobState.RUNNING
    await store.update(job, 0)
    job.state = state
    job.output = {"big": "result"}
    job.finished = finished
    await store.update(job, 1)
    return job.id


def expired_flag(url: str, job_id: str) -> bool:
    write, read = make_engines(url, StoreSettings())
    try:
        with read.connect() as conn:
            return bool(
                conn.execute(
                    sa.text("SELECT output_expired FROM jobs WHERE id = :id"), {"id": job_id}
                ).scalar_one()
            )
    finally:
        read.dispose()
        write.dispose()


async def test_outputs_expire_after_retention_and_report_it(store_url: str) -> None:
    now = 1_000_000.0
    store = await open_store(store_url, settings=StoreSettings(result_retention_s=HOUR))
    try:
        old = await finished_job(store, now - 2 * HOUR, JobState.SUCCEEDED)
        recent = await finished_job(store, now - HOUR / 2, JobState.FAILED)
        running = make_job(submitted=now - 3 * HOUR)
        await store.submit(running)
        assert await store.expire(now) == [old]
        assert await store.expire(now) == []
        gone = await store.get_job(old)
        kept = await store.get_job(recent)
        assert gone is not None and gone.output is None and gone.revision == 3
        assert kept is not None and output_value(kept.output) == {"big": "result"}
        assert gone.output_expired and not kept.output_expired
    finally:
        await store.close()
    assert expired_flag(store_url, old) and not expired_flag(store_url, recent)
    assert not expired_flag(store_url, running.id)


async def test_expire_works_in_bounded_steps(store: JobStore) -> None:
    ids = [await finished_job(store, 100.0 + i, JobState.SUCCEEDED) for i in range(5)]
    now = 100.0 + store.settings.result_retention_s + 1000  # type: ignore[operator]
    first = await store.expire(now, limit=3)
    second = await store.expire(now, limit=3)
    assert first == ids[:3] and second == ids[3:]


async def test_without_result_retention_nothing_expires(store_url: str) -> None:
    store = await open_store(store_url, settings=StoreSettings(result_retention_s=None))
    try:
        await finished_job(store, 1.0, JobState.SUCCEEDED)
        assert await store.expire(1e12) == []
    finally:
        await store.close()


async def test_an_idempotency_key_past_retention_creates_a_new_job(store_url: str) -> None:
    store = await open_store(store_url, settings=StoreSettings(idempotency_retention_s=HOUR))
    try:
        first = make_job(idempotency_key="k", request_hash="h1", submitted=10_000.0)
        await store.submit(first)
        within, created = await store.submit(
            make_job(idempotency_key="k", request_hash="h1", submitted=10_000.0 + HOUR / 2)
        )
        assert (within.id, created) == (first.id, False)
        later = make_job(idempotency_key="k", request_hash="h2", submitted=10_000.0 + 2 * HOUR)
        assert await store.submit(later) == (later, True)
        stale = await store.get_job(first.id)
        assert stale is not None and stale.idempotency_key is None
        assert stale.revision == first.revision  # a live owner keeps its compare-and-set
        again, created = await store.submit(
            make_job(idempotency_key="k", request_hash="h2", submitted=10_000.0 + 2 * HOUR + 1)
        )
        assert (again.id, created) == (later.id, False)
    finally:
        await store.close()


@pytest.mark.parametrize(
    "bad",
    [
        {"max_batch": 0},
        {"read_pool_size": 0},
        {"busy_timeout_s": -1.0},
        {"result_retention_s": 0.0},
        {"idempotency_retention_s": -5.0},
    ],
)
def test_settings_reject_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        StoreSettings(**bad)  # type: ignore[arg-type]
