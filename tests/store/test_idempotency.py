"""Idempotency keys: same key and body -> the same job; same key, other body -> refused."""

from __future__ import annotations

import asyncio

import pytest

from broker.store import JobStore, open_store
from functions.errors import IdempotencyMismatch
from tests.store.builders import make_job


async def test_the_same_key_and_body_returns_the_stored_job(store: JobStore) -> None:
    first = make_job(idempotency_key="k", request_hash="h1")
    assert (await store.submit(first))[1]
    again, created = await store.submit(make_job(idempotency_key="k", request_hash="h1"))
    assert not created
    assert again == first
    assert [j.id for j in await store.list_jobs()] == [first.id]


async def test_the_same_key_with_another_body_is_refused(store: JobStore) -> None:
    await store.submit(make_job(idempotency_key="k", request_hash="h1"))
    with pytest.raises(IdempotencyMismatch):
        await store.submit(make_job(idempotency_key="k", request_hash="h2"))


async def test_keys_are_scoped_per_caller(store: JobStore) -> None:
    await store.submit(make_job(caller="a", idempotency_key="k", request_hash="h1"))
    _, created = await store.submit(make_job(caller="b", idempotency_key="k", request_hash="h2"))
    assert created


async def test_concurrent_submits_with_one_key_create_one_job(store: JobStore) -> None:
    submits = [make_job(idempotency_key="k", request_hash="h") for _ in range(10)]
    results = await asyncio.gather(*(store.submit(j) for j in submits))
    assert sum(created for _, created in results) == 1
    assert len({job.id for job, _ in results}) == 1


async def test_a_key_survives_a_reopen(store_url: str) -> None:
    first = make_job(idempotency_key="k", request_hash="h1")
    store = await open_store(store_url)
    try:
        await store.submit(first)
    finally:
        await store.close()
    store = await open_store(store_url)
    try:
        again, created = await store.submit(make_job(idempotency_key="k", request_hash="h1"))
        assert (again.id, created) == (first.id, False)
        with pytest.raises(IdempotencyMismatch):
            await store.submit(make_job(idempotency_key="k", request_hash="h2"))
    finally:
        await store.close()
