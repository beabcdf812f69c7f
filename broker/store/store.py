"""``JobStore``: the durable record of jobs, function versions and packages.

Concurrency rule: every write goes through the one ``GroupCommitWriter`` (one thread, one
connection, group commit); writes to the same job apply in the order they were enqueued (others
may be merged, since they commute); a write's ``await`` returns after its batch committed, so a
later read (any connection) sees it. Reads run in worker
threads over a separate connection pool and never wait for the writer (SQLite WAL; InnoDB MVCC).
A ``Job`` is serialized on the event loop when its write is enqueued; the writer thread never
sees the live object.

Invariants: a job's ``revision`` moves by exactly one per successful ``update``, and only when
the caller's copy was current (compare-and-set); every stored state change is an edge of
``JOB_TRANSITIONS`` (or a field update within a non-terminal state); an ``(caller,
idempotency_key)`` maps to at most one job while the key is retained.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Collection, Iterable
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy import exc as sa_exc

from broker.jobs import Job
from broker.store import storage, writes
from broker.store.batching import JobBatchExecutor
from broker.store.codec import function_from_row, function_row, job_from_row, job_mutable_values
from broker.store.codec import job_row as encode_job
from broker.store.engine import backend_of, make_engines
from broker.store.schema import ensure_schema
from broker.store.settings import StoreSettings
from broker.store.statements import JobStatements
from broker.store.tables import functions, jobs, package_uploaders, packages
from broker.store.writer import GroupCommitWriter, WriterStats
from functions.errors import Conflict, FirepoolError, TooLarge
from functions.spec import FunctionSpec
from pool_manager.states import IllegalTransition, JobState

STATEMENT_OVERHEAD = 4096
"""A bound on what a job statement carries besides its values (SQL text, ids, numbers)."""

#: Writes that fail without changing anything; they never roll back their batch.
CLEAN_FAILURES: tuple[type[BaseException], ...] = (FirepoolError, IllegalTransition)

SUBMITTABLE: frozenset[JobState] = frozenset({JobState.QUEUED, JobState.PENDING})


class JobStore:
    """Async API over one group-commit writer and a read pool. Create with ``open_store``."""

    def __init__(
        self,
        write_engine: Engine,
        read_engine: Engine,
        settings: StoreSettings,
        clock: Callable[[], float] = time.time,
        server_statement_bytes: int | None = None,
    ) -> None:
        self.settings = settings
        self.max_statement_bytes = settings.max_statement_bytes or server_statement_bytes
        """Largest statement sent (``StoreSettings.max_statement_bytes``, else the server's
        limit; None: none)."""
        self._write_engine = write_engine
        self._read = read_engine
        self._clock = clock
        self._stmts = JobStatements(write_engine.dialect)
        self._integrity_error: type[Exception] = write_engine.dialect.loaded_dbapi.IntegrityError
        self._writer = GroupCommitWriter(
            write_engine,
            clean_failures=CLEAN_FAILURES,
            executor=JobBatchExecutor(self._stmts, CLEAN_FAILURES),
            max_batch=settings.max_batch,
        )
        self._writer.start()

    async def close(self) -> None:
        """Finish the writes already enqueued, then release every connection."""
        await self._writer.close()
        self._read.dispose()
        self._write_engine.dispose()

    def observe_commits(self, hook: Callable[[int, float], None]) -> None:
        """Tell ``hook`` ``(writes, seconds)`` of every committed transaction from now on,
        on the writer thread (``GroupCommitWriter.on_commit``)."""
        self._writer.on_commit = hook

    def writer_stats(self) -> WriterStats:
        """Group-commit counters (batches, writes, mean batch size)."""
        return self._writer.stats()

    # -- jobs -----------------------------------------------------------------------------

    async def submit(self, job: Job) -> tuple[Job, bool]:
        """Durably insert a QUEUED or PENDING job; return ``(job, True)``.

        With ``job.idempotency_key`` set and a retained job of the same caller and key: the same
        ``request_hash`` returns ``(stored job, False)`` and writes nothing; another raises
        ``IdempotencyMismatch``. A job id that already exists raises ``Conflict``.
        """
        if job.state not in SUBMITTABLE:
            raise IllegalTransition(f"a job is submitted QUEUED or PENDING, not {job.state}")
        row = encode_job(job)
        self._check_fits(row.values(), "the job's input")
        op = writes.SubmitJob(self._stmts, row, self.settings.idempotency_retention_s)
        try:
            found = await self._writer.run(op)
        except (self._integrity_error, sa_exc.IntegrityError) as exc:
            raise Conflict(f"job {job.id} already exists") from exc
        if found is None:
            return job, True
        return job_from_row(found), False

    async def update(self, job: Job, expected_revision: int) -> None:
        """Compare-and-set every mutable field of ``job`` (state, output, error, exit_code,
        retries, attempts, acquisition, started/first_instruction/finished).

        Applies iff the stored revision is ``expected_revision`` and the stored state may move
        to ``job.state``; then sets ``job.revision = expected_revision + 1``. Otherwise raises
        ``StaleRevision``, ``IllegalTransition`` or ``NotFound`` and writes nothing.
        """
        values = job_mutable_values(job)
        self._check_fits(values.values(), "the job's outcome")
        op = writes.UpdateJob(self._stmts, job.id, expected_revision, values)
        await self._writer.run(op)
        job.revision = expected_revision + 1

    def _check_fits(self, values: Iterable[object], what: str) -> None:
        """Raise ``TooLarge`` (writing nothing) for a statement over ``max_statement_bytes``."""
        limit = self.max_statement_bytes
        if limit is None:
            return
        texts = [v for v in values if isinstance(v, str)]
        if 8 * sum(map(len, texts)) + STATEMENT_OVERHEAD <= limit:  # 4 bytes a char, escaped
            return
        size = STATEMENT_OVERHEAD + sum(map(sent_size, texts))
        if size > limit:
            raise TooLarge(
                f"{what} would take {size} bytes in the job store's statement, over its "
                f"{limit}-byte limit (MySQL's max_allowed_packet, or the store's "
                "max_statement_bytes): the operator can raise it"
            )

    async def get_job(self, job_id: str) -> Job | None:
        """The stored job, or None. Past result retention its ``output`` is None and the row's
        ``output_expired`` is set (copied to ``Job.output_expired`` when the model has it)."""
        rows = await self._read_rows(select(jobs).where(jobs.c.id == job_id))
        return job_from_row(rows[0]) if rows else None

    async def list_jobs(
        self,
        *,
        caller: str | None = None,
        function: str | None = None,
        states: Collection[JobState] | None = None,
        limit: int = 100,
        output_budget: int | None = None,
    ) -> list[Job]:
        """Jobs matching every given filter, newest submitted first, as summaries: without
        their input (``Job.input`` None; ``get_job`` has it), and each with its output only
        if that output's length fits in what is left of ``output_budget``, newest first
        (None: no limit); a job whose output does not has ``output_omitted`` set. Nothing
        left out is read from the database, so listing a thousand jobs of 16 MiB outputs
        costs about one such output. (Lengths are the database's: characters on SQLite,
        bytes on MySQL.)"""
        columns = [c for c in jobs.c if c.name not in ("input", "output")]
        stmt = select(*columns, func.length(jobs.c.output).label("output_length"))
        if caller is not None:
            stmt = stmt.where(jobs.c.caller == caller)
        if function is not None:
            stmt = stmt.where(jobs.c.function == function)
        if states is not None:
            stmt = stmt.where(jobs.c.state.in_([s.value for s in states]))
        stmt = stmt.order_by(jobs.c.submitted.desc(), jobs.c.id.desc()).limit(limit)
        rows = await self._read_rows(stmt)
        left = output_budget
        wanted: list[str] = []
        for row in rows:
            size = row.pop("output_length")
            if size is None:
                continue
            if left is not None and size > left:
                row["output_omitted"] = True
                continue
            wanted.append(row["id"])
            if left is not None:
                left -= size
        outputs: dict[str, Any] = {}
        for start in range(0, len(wanted), 500):  # bounded IN lists
            chunk = wanted[start : start + 500]
            found = select(jobs.c.id, jobs.c.output).where(jobs.c.id.in_(chunk))
            outputs.update((r["id"], r["output"]) for r in await self._read_rows(found))
        for row in rows:
            row["output"] = outputs.get(row["id"])
        return [job_from_row(r) for r in rows]

    async def jobs_in_states(self, states: Collection[JobState]) -> list[Job]:
        """Every job in ``states``, oldest submitted first (restart recovery, App. A.1)."""
        stmt = (
            select(jobs)
            .where(jobs.c.state.in_([s.value for s in states]))
            .order_by(jobs.c.submitted, jobs.c.id)
        )
        return [job_from_row(r) for r in await self._read_rows(stmt)]

    async def expire(self, now: float, *, limit: int = 1000) -> list[str]:
        """Clear outputs older than ``settings.result_retention_s``; return the job ids cleared
        (the caller deletes their logs). At most ``limit`` per call: call again while the list
        is full. Idempotency keys need no sweep: ``submit`` ignores keys past retention."""
        retention = self.settings.result_retention_s
        if retention is None:
            return []
        op = functools.partial(writes.expire_outputs, cutoff=now - retention, limit=limit)
        return await self._writer.run(op)

    # -- functions and packages -----------------------------------------------------------

    async def put_function(self, spec: FunctionSpec, *, as_admin: bool = False) -> FunctionSpec:
        """Register ``spec`` as the next version of its name (deleted versions count, so a
        version number is never reused); return it with ``version`` and ``created`` set.
        Raises ``Forbidden`` when the name's latest live version belongs to another owner
        than ``spec.owner``, unless ``as_admin``."""
        created = self._clock()
        row = function_row(dataclasses.replace(spec, created=created))
        caller = None if as_admin else spec.owner
        version = await self._writer.run(
            functools.partial(writes.put_function, row=row, caller=caller)
        )
        return dataclasses.replace(spec, version=version, created=created)

    async def get_function(self, name: str, version: int | None = None) -> FunctionSpec | None:
        """Version ``version`` of a live function, or its latest when None."""
        stmt = select(functions).where(functions.c.name == name, functions.c.deleted.is_(False))
        if version is not None:
            stmt = stmt.where(functions.c.version == version)
        stmt = stmt.order_by(functions.c.version.desc()).limit(1)
        rows = await self._read_rows(stmt)
        return function_from_row(rows[0]) if rows else None

    async def list_functions(self) -> list[FunctionSpec]:
        """The latest version of every live function, by name."""
        stmt = (
            select(functions)
            .where(functions.c.deleted.is_(False))
            .order_by(functions.c.name, functions.c.version.desc())
        )
        latest: dict[str, FunctionSpec] = {}
        for row in await self._read_rows(stmt):
            latest.setdefault(row["name"], function_from_row(row))
        return list(latest.values())

    async def delete_function(self, name: str, caller: str | None = None) -> bool:
        """Hide every version of ``name``; False if there was no live version. Raises
        ``Forbidden`` when it belongs to another owner than ``caller`` (None: an admin)."""
        return await self._writer.run(
            functools.partial(writes.delete_function, name=name, caller=caller, now=self._clock())
        )

    async def put_package(self, digest: str, size: int, uploader: str) -> None:
        """Record an uploaded package and that ``uploader`` sent its bytes (idempotent)."""
        op = functools.partial(
            writes.put_package, digest=digest, size=size, created=self._clock(), uploader=uploader
        )
        await self._writer.run(op)

    async def has_package(self, digest: str) -> bool:
        rows = await self._read_rows(select(packages.c.digest).where(packages.c.digest == digest))
        return bool(rows)

    async def uploaded_by(self, digest: str, caller: str) -> bool:
        """Whether ``caller`` uploaded the package ``digest`` (``put_package``)."""
        by = package_uploaders.c
        stmt = select(by.digest).where(by.digest == digest, by.caller == caller)
        return bool(await self._read_rows(stmt))

    # -- storage collection and quotas (``broker.store.storage``) ------------------------

    async def forget_packages(
        self, digests: Collection[str], now: float, grace_s: float
    ) -> list[str]:
        """Of ``digests``, those no function version, active job, recent upload or upload
        hold keeps at ``now`` (``storage`` says which), their rows deleted in one write; the
        caller then deletes their bytes. Expired holds go too."""
        op = functools.partial(storage.forget_packages, digests=digests, now=now, grace_s=grace_s)
        return await self._writer.run(op)

    async def hold_package(self, digest: str, caller: str, size: int, expires: float) -> None:
        """Record an upload ``caller`` was authorised to make: until ``expires`` the package
        is not collected and ``size`` counts against the caller's quota (until it uploads)."""
        op = functools.partial(
            storage.hold_package, digest=digest, caller=caller, size=size, expires=expires
        )
        await self._writer.run(op)

    async def release_hold(self, digest: str, caller: str) -> None:
        """Drop ``caller``'s upload hold on ``digest``, if any."""
        await self._writer.run(
            functools.partial(storage.release_hold, digest=digest, caller=caller)
        )

    async def stored_bytes(self, caller: str, now: float) -> int:
        """Bytes counted against ``caller``'s storage quota at ``now``: every package it
        uploaded, in full, and its unexpired holds of packages it has not uploaded."""
        rows = await self._read_rows(storage.stored_bytes_query(caller, now))
        return int(rows[0]["used"])

    async def retained_jobs(self, job_ids: Collection[str]) -> set[str]:
        """Those of ``job_ids`` that exist with their output not expired (their logs stay)."""
        kept: set[str] = set()
        for chunk in storage.chunks(job_ids):
            rows = await self._read_rows(storage.retained_jobs_query(chunk))
            kept.update(row["id"] for row in rows)
        return kept

    # -- reads ----------------------------------------------------------------------------

    async def select(self, stmt: Any) -> list[tuple[Any, ...]]:
        """The rows of the read-only query ``stmt`` over the store's tables, on the read pool,
        as tuples (a third of the cost of dicts on 10,000 rows): for report modules that
        aggregate what no method here reads (``broker.dashboard_views``)."""
        return await asyncio.to_thread(self._select_sync, stmt)

    def _select_sync(self, stmt: Any) -> list[tuple[Any, ...]]:
        with self._read.connect() as conn:
            return list(conn.execute(stmt).all())  # a Row is a tuple

    async def _read_rows(self, stmt: Any) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._read_rows_sync, stmt)

    def _read_rows_sync(self, stmt: Any) -> list[dict[str, Any]]:
        with self._read.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]


def sent_size(text: str) -> int:
    """Bytes ``text`` takes inline in a MySQL statement: PyMySQL escapes each quote and
    backslash (JSON text holds no raw control characters, the other escaped bytes)."""
    data = text.encode()
    return len(data) + data.count(b"'") + data.count(b'"') + data.count(b"\\")


async def open_store(
    url: str,
    *,
    migrate: bool = False,
    settings: StoreSettings | None = None,
    clock: Callable[[], float] = time.time,
) -> JobStore:
    """Open the store at ``url`` (``sqlite:///path.db`` or ``mysql+pymysql://...``).

    An empty database is created at the newest schema; an older schema raises ``SchemaError``
    (run ``firepool migrate``) unless ``migrate=True``; a newer one always raises it.
    ``clock`` stamps function and package registrations (job times come from the job).
    """
    settings = settings or StoreSettings()
    return await asyncio.to_thread(_open_blocking, url, migrate, settings, clock)


def _open_blocking(
    url: str, migrate: bool, settings: StoreSettings, clock: Callable[[], float]
) -> JobStore:
    write, read = make_engines(url, settings)
    try:
        ensure_schema(read, migrate=migrate)
        packet = None
        if backend_of(url) == "mysql":
            with read.connect() as conn:
                packet = int(conn.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())
        return JobStore(write, read, settings, clock, server_statement_bytes=packet)
    except BaseException:
        read.dispose()
        write.dispose()
        raise
