"""The job store's side of storage collection and quotas (``broker.store.storage``), on
SQLite and MySQL: which packages may be forgotten, upload holds, bytes per caller."""

from __future__ import annotations

import time

import sqlalchemy as sa

from broker.store import JobStore, StoreSettings, open_store
from broker.store.engine import make_engines
from broker.store.schema import upgrade_to
from pool_manager.states import JobState
from tests.store.builders import make_job, make_spec

GRACE = 100.0


class Clock:
    """The store's clock (it stamps uploads and deletions), moved by the test."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def digest(c: str) -> str:
    return c * 64


async def test_only_packages_nothing_keeps_are_forgotten(store_url: str) -> None:
    clock = Clock(1_000_000.0)
    store = await open_store(store_url, clock=clock)
    try:
        names = "lrdjuhgo"  # live, requirements, deleted late, job, uploaded, held, gone, old
        for c in names:
            await store.put_package(digest(c), 10, "alice")
        await store.put_function(make_spec(name="live", package_digest=digest("l")))
        await store.put_function(
            make_spec(name="req", package_digest=digest("l"), requirements_digest=digest("r"))
        )
        await store.put_function(make_spec(name="gone", package_digest=digest("g")))
        await store.delete_function("gone")
        await store.put_function(make_spec(name="queued", package_digest=digest("j")))
        job = make_job(function="queued", version=1)
        await store.submit(job)
        await store.delete_function("queued")
        clock.now += GRACE / 2
        await store.put_function(make_spec(name="late", package_digest=digest("d")))
        await store.delete_function("late")
        await store.put_package(digest("u"), 10, "bob")  # uploaded again
        await store.hold_package(digest("h"), "carol", 10, expires=clock.now + 10 * GRACE)
        clock.now += GRACE / 2 + 1
        forgotten = await store.forget_packages([digest(c) for c in names], clock.now, GRACE)
        assert sorted(forgotten) == [digest("g"), digest("o")]
        assert not await store.has_package(digest("g"))
        assert not await store.uploaded_by(digest("o"), "alice")
        assert await store.uploaded_by(digest("d"), "alice")
        job.state = JobState.CANCELLED
        await store.update(job, 0)
        clock.now += GRACE
        forgotten = await store.forget_packages([digest(c) for c in "lrdjuh"], clock.now, GRACE)
        assert sorted(forgotten) == [digest("d"), digest("j"), digest("u")]
        assert await store.has_package(digest("l")) and await store.has_package(digest("r"))
        assert await store.has_package(digest("h"))  # its hold has not expired
    finally:
        await store.close()


async def test_an_expired_hold_keeps_nothing_and_is_dropped(store_url: str) -> None:
    store = await open_store(store_url)
    try:
        await store.hold_package(digest("h"), "carol", 10, expires=50.0)
        assert await store.stored_bytes("carol", 49.0) == 10
        assert await store.forget_packages([digest("h")], 60.0, GRACE) == [digest("h")]
        assert await store.stored_bytes("carol", 0.0) == 0  # the row is gone, not just past
    finally:
        await store.close()


async def test_a_caller_stores_every_package_it_uploaded_and_what_it_holds(
    store_url: str,
) -> None:
    store = await open_store(store_url)
    try:
        await store.put_package(digest("a"), 100, "alice")
        await store.put_package(digest("a"), 100, "alice")  # again: counted once
        await store.put_package(digest("a"), 100, "bob")  # shared: counted for both
        await store.put_package(digest("b"), 7, "bob")
        await store.hold_package(digest("c"), "alice", 1000, expires=time.time() + 60)
        await store.hold_package(digest("a"), "alice", 100, expires=time.time() + 60)
        await store.hold_package(digest("d"), "alice", 5000, expires=time.time() - 1)
        now = time.time()
        assert await store.stored_bytes("alice", now) == 1100
        assert await store.stored_bytes("bob", now) == 107
        assert await store.stored_bytes("carol", now) == 0
        await store.put_package(digest("c"), 1000, "alice")  # the held upload finished
        await store.release_hold(digest("c"), "alice")
        assert await store.stored_bytes("alice", now) == 1100
    finally:
        await store.close()


async def test_logs_are_kept_only_for_jobs_with_their_output(store_url: str) -> None:
    store = await open_store(store_url, settings=StoreSettings(result_retention_s=GRACE))
    try:
        ended, fresh = make_job(), make_job()
        await store.submit(fresh)
        await store.submit(ended)
        ended.state, ended.finished = JobState.CANCELLED, ended.submitted + 1
        await store.update(ended, 0)
        assert await store.expire(ended.finished + 2 * GRACE) == [ended.id]
        asked = [ended.id, fresh.id, "no-such-job"]
        assert await store.retained_jobs(asked) == {fresh.id}
    finally:
        await store.close()


async def test_migration_0004_starts_every_grace_period_at_the_upgrade(empty_url: str) -> None:
    write, read = make_engines(empty_url, StoreSettings())
    try:
        upgrade_to(read, "0003")
        function = sa.text(
            "INSERT INTO functions (name, version, sku, package_digest, entrypoint, command, "
            "requirements_digest, env, timeout_s, max_retries, pods, single_use, created, "
            "owner, deleted) VALUES (:name, 1, 'cpu', :package, 'm:f', NULL, NULL, '{}', 1, 0, "
            "1, 0, 0, 'alice', :deleted)"
        )
        with read.begin() as conn:
            conn.execute(function, {"name": "old", "package": digest("o"), "deleted": True})
            conn.execute(function, {"name": "live", "package": digest("l"), "deleted": False})
            conn.execute(
                sa.text("INSERT INTO packages (digest, size, created) VALUES (:d, 3, 5.0)"),
                {"d": digest("o")},
            )
    finally:
        read.dispose()
        write.dispose()
    before = time.time()
    store: JobStore = await open_store(empty_url, migrate=True)
    try:
        assert (
            await store.forget_packages([digest("o"), digest("l")], before + GRACE / 2, GRACE) == []
        )
        now = time.time()
        assert await store.forget_packages([digest("o")], now + GRACE, GRACE) == [digest("o")]
    finally:
        await store.close()
