"""Group commit: concurrent writes share a transaction, and a bad entry fails alone."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable
from typing import Any

import pytest

from broker.jobs import JsonText
from broker.store import JobStore
from broker.store.writer import WriteContext
from functions.errors import Conflict
from pool_manager.states import JobState
from tests.store.builders import make_job


async def held_batch(store: JobStore, writes: list[Awaitable[Any]]) -> list[Any]:
    """Run ``writes`` as one batch: park the writer on a gate, enqueue them all, open it."""
    started, release = threading.Event(), threading.Event()

    def gate(_ctx: WriteContext) -> None:
        started.set()
        release.wait(10)

    gate_done = asyncio.ensure_future(store._writer.run(gate))
    assert await asyncio.to_thread(started.wait, 10)
    tasks = [asyncio.ensure_future(w) for w in writes]
    await asyncio.sleep(0)  # every task has enqueued its write
    release.set()
    await gate_done
    return await asyncio.gather(*tasks, return_exceptions=True)


async def test_concurrent_writes_are_committed_in_batches(store: JobStore) -> None:
    before = store.writer_stats()
    jobs = [make_job() for _ in range(300)]
    await asyncio.gather(*(store.submit(j) for j in jobs))
    for job in jobs:
        job.state = JobState.RUNNING
    await asyncio.gather(*(store.update(j, 0) for j in jobs))
    after = store.writer_stats()
    writes = after.writes - before.writes
    batches = after.batches - before.batches
    assert writes == 600
    assert writes / batches > 1
    assert after.mean_batch > 1


async def test_a_stale_update_fails_alone_without_rolling_back_its_batch(
    store: JobStore,
) -> None:
    base = make_job()
    await store.submit(base)
    base.state = JobState.RUNNING
    await store.update(base, 0)
    fresh = [make_job() for _ in range(5)]
    stale = dataclasses.replace(base, state=JobState.CANCELLED)
    before = store.writer_stats()
    results = await held_batch(
        store, [store.submit(fresh[0]), store.update(stale, 0), *map(store.submit, fresh[1:])]
    )
    assert [type(r).__name__ for r in results] == [
        "tuple",
        "StaleRevision",
        "tuple",
        "tuple",
        "tuple",
        "tuple",
    ]
    after = store.writer_stats()
    assert after.replayed_batches == before.replayed_batches
    assert after.batches - before.batches == 2  # the gate, then one batch of six
    for job in fresh:
        assert await store.get_job(job.id) == job


async def test_a_duplicate_key_fails_alone_and_the_rest_of_its_batch_commits(
    store: JobStore,
) -> None:
    existing = make_job()
    await store.submit(existing)
    fresh = [make_job() for _ in range(4)]
    duplicate = dataclasses.replace(existing, input="another body")
    results = await held_batch(
        store, [store.submit(fresh[0]), store.submit(duplicate), *map(store.submit, fresh[1:])]
    )
    assert isinstance(results[1], Conflict)
    assert all(isinstance(r, tuple) and r[1] for i, r in enumerate(results) if i != 1)
    assert store.writer_stats().replayed_batches == 1
    for job in fresh:
        assert await store.get_job(job.id) == job
    assert await store.get_job(existing.id) == existing


async def test_a_write_whose_waiter_is_cancelled_still_happens(store: JobStore) -> None:
    job = make_job()
    task = asyncio.ensure_future(store.submit(job))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):
        if await store.get_job(job.id) is not None:
            break
        await asyncio.sleep(0.01)
    assert await store.get_job(job.id) == job


async def test_writes_after_close_are_refused(store_url: str) -> None:
    from broker.store import open_store

    store = await open_store(store_url)
    pending = asyncio.ensure_future(store.submit(make_job()))
    await asyncio.sleep(0)
    await store.close()
    assert (await pending)[1]  # enqueued before close: applied
    with pytest.raises(RuntimeError, match="closed"):
        await store.submit(make_job())


async def test_writes_to_one_job_in_one_batch_apply_in_order(store: JobStore) -> None:
    job = make_job()
    running = dataclasses.replace(job, state=JobState.RUNNING)
    done = dataclasses.replace(job, state=JobState.SUCCEEDED, output=JsonText("[1]"), finished=5.0)
    others = [make_job() for _ in range(3)]
    results = await held_batch(
        store,
        [
            store.submit(job),
            store.submit(others[0]),
            store.update(running, 0),
            store.submit(others[1]),
            store.update(done, 1),
            store.submit(others[2]),
        ],
    )
    assert not [r for r in results if isinstance(r, BaseException)]
    assert await store.get_job(job.id) == done
    assert done.revision == 2


async def test_a_mixed_batch_commits_every_kind_of_write(store: JobStore) -> None:
    from tests.store.builders import make_spec

    keyed = make_job(idempotency_key="k", request_hash="h")
    plain = [make_job() for _ in range(3)]
    for job in plain[:2]:
        await store.submit(job)
    moved = [dataclasses.replace(j, state=JobState.RUNNING) for j in plain[:2]]
    results = await held_batch(
        store,
        [
            store.update(moved[0], 0),
            store.put_function(make_spec(name="mixed")),
            store.submit(keyed),
            store.submit(plain[2]),
            store.put_package("d" * 64, 10, "alice"),
            store.update(moved[1], 0),
        ],
    )
    assert not [r for r in results if isinstance(r, BaseException)]
    for job in [*moved, keyed, plain[2]]:
        assert await store.get_job(job.id) == job
    spec = await store.get_function("mixed")
    assert spec is not None and spec.version == 1
    assert await store.has_package("d" * 64)
