"""Storage collection (``broker.storage_collection``) over every package store: a package no
function version references is gone once the grace period has passed since its last upload
and its last version's deletion, and a referenced one never is; an upload in progress keeps
its package; logs past retention go.

The property test runs random deploy / upload / delete-function / collect / advance-clock
sequences against a real job store (SQLite, copied per example from one migrated at the
start) and a real package store (memory, local disk, and S3 on a real SeaweedFS where it can
start). The clock is real time plus an offset the sequence advances, in steps of 10 s against
a 100 s grace period, so the store's own times (a file's mtime, an object's LastModified)
never run ahead of it and no check sits within a clock tick of a boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import shutil
import time
import zipfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.lifecycle import LogArchive
from broker.storage_collection import StorageCollector
from broker.store import JobStore, migrate, open_store
from functions.stores import PACKAGE_STORES, PackageStore, UrlSigner, open_package_store
from pool_manager.states import JobState
from tests.functions.s3_server import S3Server
from tests.store.builders import make_job, make_spec

GRACE = 100.0
STEP = 10.0
PACKAGES = 3
FUNCTIONS = 2


class Clock:
    """Real time plus ``offset`` (never behind a store's own timestamps)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def package(n: int) -> tuple[str, bytes]:
    data = f"package {n}\n".encode() * (n + 1)
    return hashlib.sha256(data).hexdigest(), data


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite job store at the newest schema, copied for each example (no migration each)."""
    path = tmp_path_factory.mktemp("template") / "jobs.db"
    migrate(f"sqlite:///{path}")
    return path


@pytest.fixture(params=PACKAGE_STORES)
def store_factory(request: pytest.FixtureRequest) -> Any:
    """Makes a new, empty package store of one kind under a directory; ``clock`` stamps the
    memory store's packages (the others keep their own times)."""
    kind = request.param
    server: S3Server | None = request.getfixturevalue("s3_env") if kind == "s3" else None

    def make(root: Path, clock: Clock) -> PackageStore:
        if kind == "memory":
            from functions.stores import MemoryPackageStore

            return MemoryPackageStore(UrlSigner(b"k" * 32), "http://broker.test", 60, clock)
        return open_package_store(
            kind,
            root=root,
            signer=UrlSigner(b"k" * 32),
            base_url="http://broker.test",
            ttl_s=60,
            s3=server.config() if server is not None else None,
        )

    make.kind = kind  # type: ignore[attr-defined]
    return make


@dataclass
class World:
    """The stores under test and what the test expects of them."""

    packages: PackageStore
    jobs: JobStore
    collector: StorageCollector
    clock: Clock
    last_upload: dict[int, float] = field(default_factory=dict)
    """Package -> clock offset of its last upload (while the test expects it stored)."""
    versions: list[tuple[int, int, float | None]] = field(default_factory=list)
    """(function, package, clock offset of its deletion or None while live)."""

    async def upload(self, p: int, caller: str) -> None:
        digest, data = package(p)
        with self.packages.upload(digest) as upload:
            upload.write(data)
            await asyncio.to_thread(upload.commit)
        await self.jobs.put_package(digest, len(data), caller)
        self.last_upload[p] = self.clock.offset

    async def deploy(self, f: int, p: int) -> None:
        await self.upload(p, "deployer")
        spec = make_spec(name=f"f{f}", package_digest=package(p)[0], owner="deployer")
        await self.jobs.put_function(spec)
        self.versions.append((f, p, None))

    async def delete(self, f: int) -> None:
        await self.jobs.delete_function(f"f{f}")
        self.versions = [
            (g, p, self.clock.offset if g == f and gone is None else gone)
            for g, p, gone in self.versions
        ]

    def referenced(self, p: int) -> bool:
        return any(q == p and gone is None for _, q, gone in self.versions)

    def due(self, p: int) -> bool:
        """Whether the grace period of ``p`` has passed at the clock's offset now."""
        now = self.clock.offset
        deletions = [gone for _, q, gone in self.versions if q == p and gone is not None]
        return not self.referenced(p) and all(
            t + GRACE <= now for t in [self.last_upload[p], *deletions]
        )

    async def collect(self) -> None:
        await self.collector.collect()
        for p in range(PACKAGES):
            stored = await asyncio.to_thread(self.packages.exists, package(p)[0])
            if self.referenced(p):
                assert stored, f"package {p} is referenced and was deleted"
            elif p in self.last_upload and self.due(p):
                assert not stored, f"package {p} is past its grace period and still stored"
                del self.last_upload[p]
            elif p in self.last_upload:
                assert stored, f"package {p} was deleted within its grace period"


steps = st.lists(
    st.one_of(
        st.tuples(st.just("deploy"), st.integers(0, FUNCTIONS - 1), st.integers(0, PACKAGES - 1)),
        st.tuples(st.just("upload"), st.integers(0, PACKAGES - 1), st.sampled_from("ab")),
        st.tuples(st.just("delete"), st.integers(0, FUNCTIONS - 1)),
        st.tuples(st.just("advance"), st.integers(1, 12)),
        st.tuples(st.just("advance"), st.just(9)),  # lands on a boundary with a later step
        st.tuples(st.just("collect")),
    ),
    max_size=30,
)


async def run_steps(
    world_at: Any, root: Path, plan: list[tuple[Any, ...]], check_every_step: bool = True
) -> None:
    async with world_at(root) as world:
        for step in plan:
            if step[0] == "deploy":
                await world.deploy(step[1], step[2])
            elif step[0] == "upload":
                await world.upload(step[1], step[2])
            elif step[0] == "delete":
                await world.delete(step[1])
            elif step[0] == "advance":  # and look: collection sees every time the clock does
                world.clock.offset += step[1] * STEP
                await world.collect()
            else:
                await world.collect()
        world.clock.offset += 2 * GRACE
        await world.collect()  # everything unreferenced is due now
        assert not [p for p in world.last_upload if not world.referenced(p)]


@pytest.fixture
def world_at(template_db: Path, store_factory: Any) -> Any:
    @contextlib.asynccontextmanager
    async def open_world(root: Path) -> AsyncIterator[World]:
        shutil.copy(template_db, root / "jobs.db")
        clock = Clock()
        jobs = await open_store(f"sqlite:///{root / 'jobs.db'}", clock=clock)
        try:
            packages = store_factory(root / "packages", clock)
            collector = StorageCollector(packages, jobs, LogArchive(root / "logs"), GRACE, clock)
            yield World(packages, jobs, collector, clock)
        finally:
            await jobs.close()

    return open_world


EXAMPLES = {"memory": 50, "local": 30, "s3": 10}
"""Examples per store: S3 round trips cost about ten times the others'."""


def test_an_unreferenced_package_goes_after_the_grace_period_and_a_referenced_one_never(
    world_at: Any, store_factory: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    @settings(max_examples=EXAMPLES[store_factory.kind], deadline=None)
    @given(plan=steps)
    def run(plan: list[tuple[Any, ...]]) -> None:
        asyncio.run(run_steps(world_at, tmp_path_factory.mktemp("world"), plan))

    run()


async def test_an_upload_in_progress_keeps_its_package(world_at: Any, tmp_path: Path) -> None:
    async with world_at(tmp_path) as world:
        await world.upload(0, "a")
        world.clock.offset += 2 * GRACE
        digest = package(0)[0]
        async with world.collector.guard.using(digest):
            assert (await world.collector.collect()).packages == 0
            assert world.packages.exists(digest)
        collected = await world.collector.collect()
        assert (collected.packages, collected.bytes) == (1, len(package(0)[1]))
        assert not world.packages.exists(digest)


async def test_an_upload_waits_for_its_package_to_be_collected_then_stores_it_again(
    world_at: Any, tmp_path: Path
) -> None:
    async with world_at(tmp_path) as world:
        await world.upload(1, "a")
        world.clock.offset += 2 * GRACE
        digest = package(1)[0]
        assert world.collector.guard.start_collecting([digest]) == [digest]
        entered = asyncio.Event()

        async def upload_again() -> None:
            async with world.collector.guard.using(digest):
                entered.set()
                await world.upload(1, "b")

        task = asyncio.create_task(upload_again())
        await asyncio.sleep(0.05)
        assert not entered.is_set()  # held off while the package is being collected
        assert await world.jobs.forget_packages([digest], world.clock(), GRACE) == [digest]
        assert world.packages.delete(digest)
        world.collector.guard.done_collecting([digest])
        await task
        assert world.packages.exists(digest) and await world.jobs.uploaded_by(digest, "b")


async def test_an_authorised_upload_keeps_its_package_until_the_hold_expires(
    world_at: Any, tmp_path: Path
) -> None:
    async with world_at(tmp_path) as world:
        await world.upload(2, "a")
        digest = package(2)[0]
        await world.jobs.hold_package(digest, "b", 10, expires=world.clock() + 3 * GRACE)
        world.clock.offset += 2 * GRACE
        assert (await world.collector.collect()).kept == 1
        world.clock.offset += 2 * GRACE
        assert (await world.collector.collect()).packages == 1


async def test_a_job_still_to_run_keeps_its_deleted_function_s_package(
    world_at: Any, tmp_path: Path
) -> None:
    async with world_at(tmp_path) as world:
        await world.deploy(0, 3)
        job = make_job(function="f0", version=1)
        await world.jobs.submit(job)
        await world.delete(0)
        world.clock.offset += 2 * GRACE
        assert (await world.collector.collect()).packages == 0
        job.state = JobState.CANCELLED
        await world.jobs.update(job, 0)
        assert (await world.collector.collect()).packages == 1


async def test_logs_of_jobs_past_retention_or_unknown_are_deleted(
    world_at: Any, tmp_path: Path
) -> None:
    async with world_at(tmp_path) as world:
        logs = LogArchive(tmp_path / "logs")
        kept, expired = make_job(), make_job()
        for job in (kept, expired):
            await world.jobs.submit(job)
            logs.write(job.id, b"line\n", 0)
        logs.write("unknown-job", b"orphan\n", 0)
        expired.state, expired.finished = JobState.CANCELLED, expired.submitted
        await world.jobs.update(expired, 0)
        assert await world.jobs.expire(expired.submitted + 8 * 86400) == [expired.id]
        assert await world.collector.delete_expired_logs() == 2
        assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [f"{kept.id}.log"]


async def test_the_broker_s_sweep_collects_what_no_function_uses_and_keeps_the_rest(
    tmp_path: Path,
) -> None:
    """The background loop, not a direct call: grace 0, a sweep every 50 ms."""
    from gateway.auth import Role
    from tests.inprocess import inprocess_broker

    async with inprocess_broker(tmp_path, package_grace_s=0.0, storage_sweep_s=0.05) as fp:
        headers = fp.headers("deployer", Role.DEPLOY)
        used, used_data = zipped("used")
        spare, spare_data = zipped("spare")
        # With no grace period, a deploy's upload and registration are only safe together:
        # holding the digest in use stands in for a grace period longer than the deploy.
        async with fp.broker.collector.guard.using(used):
            for digest, data in ((used, used_data), (spare, spare_data)):
                put = await fp.client.put(f"/v1/packages/{digest}", content=data, headers=headers)
                assert put.status_code == 201
            body = {"name": "kept", "sku": "cpu", "package_digest": used, "command": ["true"]}
            registered = await fp.client.post("/v1/functions", json=body, headers=headers)
            assert registered.status_code == 201, registered.text
        for _ in range(400):  # until the sweep has run past the spare package (20 s at most)
            if not fp.broker.packages.exists(spare):
                break
            await asyncio.sleep(0.05)
        assert not fp.broker.packages.exists(spare)
        assert fp.broker.packages.exists(used)


def zipped(name: str) -> tuple[str, bytes]:
    """A package zip holding one file ``name``, and its digest."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(name, name)
    data = buffer.getvalue()
    return hashlib.sha256(data).hexdigest(), data
