"""The write operations the group-commit writer runs.

Every write here runs on the writer thread inside a batch transaction (see ``writer.py``) and
follows its contract: it either completes, or raises a *clean* failure (``StaleRevision``,
``IllegalTransition``, ``NotFound``, ``IdempotencyMismatch``) before changing anything, or
raises anything else and lets the batch roll back and replay entry by entry.

``SubmitJob`` and ``UpdateJob`` are data as well as callables, so ``batching.py`` can merge
runs of them into bulk statements; the rest are plain functions bound with ``partial``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import false, func, insert, select, update

from broker.store.errors import StaleRevision
from broker.store.statements import JobStatements, cas_params
from broker.store.tables import functions, jobs, package_uploaders, packages
from broker.store.writer import WriteContext
from functions.errors import Forbidden, IdempotencyMismatch, NotFound
from pool_manager.states import TERMINAL_JOB_STATES, IllegalTransition, JobState


@dataclass(frozen=True, slots=True)
class SubmitJob:
    """Insert a job row; the result is None, or the stored row when its idempotency key
    matched (same ``request_hash``). A key older than ``key_retention_s`` (measured against the
    new job's ``submitted``) no longer deduplicates: the old job gives it up, the new one takes it.
    """

    stmts: JobStatements
    row: dict[str, Any]
    key_retention_s: float | None

    @property
    def job_id(self) -> str:
        return str(self.row["id"])

    @property
    def plain(self) -> bool:
        """No idempotency key: a bare insert that can join a bulk insert."""
        return self.row["idempotency_key"] is None

    def __call__(self, ctx: WriteContext) -> dict[str, Any] | None:
        row = self.row
        key = row["idempotency_key"]
        if key is not None:
            found = (
                ctx.conn.execute(
                    select(jobs).where(
                        jobs.c.caller == row["caller"], jobs.c.idempotency_key == key
                    )
                )
                .mappings()
                .first()
            )
            if found is not None:
                retention = self.key_retention_s
                if retention is None or found["submitted"] >= row["submitted"] - retention:
                    if found["request_hash"] != row["request_hash"]:
                        raise IdempotencyMismatch(
                            "this Idempotency-Key was used with a different request",
                            field="Idempotency-Key",
                        )
                    return dict(found)
                # past retention; no revision bump: the key is not a field ``update`` writes
                ctx.conn.execute(
                    update(jobs).where(jobs.c.id == found["id"]).values(idempotency_key=None)
                )
        self.stmts.insert_job.execute(ctx.cursor, row)
        return None


@dataclass(frozen=True, slots=True)
class UpdateJob:
    """Compare-and-set: write ``values`` iff the row is at ``expected_revision`` and in a state
    from which ``values["state"]`` is allowed; bump the revision by one."""

    stmts: JobStatements
    job_id: str
    expected_revision: int
    values: dict[str, Any]

    @property
    def target(self) -> JobState:
        return JobState(self.values["state"])

    def params(self) -> dict[str, Any]:
        return cas_params(self.job_id, self.expected_revision, self.values)

    def __call__(self, ctx: WriteContext) -> None:
        if self.stmts.cas[self.target].execute(ctx.cursor, self.params()) != 1:
            self.explain_miss(ctx)

    def explain_miss(self, ctx: WriteContext) -> None:
        """The compare-and-set matched no row: raise the clean failure that says why."""
        found = ctx.conn.execute(
            select(jobs.c.state, jobs.c.revision).where(jobs.c.id == self.job_id)
        ).first()
        if found is None:
            raise NotFound(f"job {self.job_id} does not exist")
        if found.revision != self.expected_revision:
            raise StaleRevision(self.job_id, self.expected_revision, found.revision)
        raise IllegalTransition(f"job {self.job_id}: {found.state} -> {self.target} is not allowed")


def _check_owner(ctx: WriteContext, name: str, caller: str | None) -> None:
    """Raise ``Forbidden`` unless ``caller`` (None: an admin) may change function ``name``: a
    name belongs to the owner of its latest live version (none, or an unowned one: anyone's)."""
    if caller is None:
        return
    owner = ctx.conn.execute(
        select(functions.c.owner)
        .where(functions.c.name == name, functions.c.deleted.is_(False))
        .order_by(functions.c.version.desc())
        .limit(1)
    ).scalar()
    if owner and owner != caller:
        raise Forbidden(f"function {name!r} belongs to {owner!r}; only its owner or an admin "
                        "may change it")  # fmt: skip


def put_function(ctx: WriteContext, row: dict[str, Any], caller: str | None = None) -> int:
    """Insert ``row`` as version latest + 1 of its name (deleted versions count); return it.
    ``caller``: who registers it (``Forbidden`` unless the name is theirs; None: an admin)."""
    _check_owner(ctx, row["name"], caller)
    latest = ctx.conn.execute(
        select(func.max(functions.c.version)).where(functions.c.name == row["name"])
    ).scalar()
    version = (latest or 0) + 1
    ctx.conn.execute(insert(functions).values({**row, "version": version}))
    return version


def delete_function(
    ctx: WriteContext, name: str, caller: str | None = None, now: float = 0.0
) -> bool:
    """Hide every version of ``name`` as of ``now`` (``deleted_at``: when its packages' grace
    period starts); True if some version was live. ``caller`` as for ``put_function``."""
    _check_owner(ctx, name, caller)
    result = ctx.conn.execute(
        update(functions)
        .where(functions.c.name == name, functions.c.deleted.is_(False))
        .values(deleted=True, deleted_at=now)
    )
    return result.rowcount > 0


def put_package(ctx: WriteContext, digest: str, size: int, created: float, uploader: str) -> None:
    """Record a package once, and ``uploader`` once among its uploaders; what is already
    known is left as it is, but for the package's ``last_uploaded``, which moves to
    ``created`` (a package's grace period starts again at each upload). (One writer thread
    applies writes in order, so the read and the insert cannot race another upload of the
    same digest.)"""
    known = ctx.conn.execute(select(packages.c.digest).where(packages.c.digest == digest)).first()
    if known is None:
        ctx.conn.execute(
            insert(packages).values(
                digest=digest, size=size, created=created, last_uploaded=created
            )
        )
    else:
        ctx.conn.execute(
            update(packages).where(packages.c.digest == digest).values(last_uploaded=created)
        )
    by = package_uploaders.c
    if ctx.conn.execute(
        select(by.digest).where(by.digest == digest, by.caller == uploader)
    ).first() is None:  # fmt: skip
        ctx.conn.execute(
            insert(package_uploaders).values(digest=digest, caller=uploader, created=created)
        )


def expire_outputs(ctx: WriteContext, cutoff: float, limit: int) -> list[str]:
    """Clear the output of up to ``limit`` terminal jobs finished before ``cutoff`` and mark
    them ``output_expired``; return their ids. Their revision moves by one (a durable change;
    a terminal job has no owner holding a revision)."""
    terminal = [s.value for s in TERMINAL_JOB_STATES]
    ids = list(
        ctx.conn.execute(
            select(jobs.c.id)
            .where(
                jobs.c.output_expired == false(),
                jobs.c.finished < cutoff,
                jobs.c.state.in_(terminal),
            )
            .order_by(jobs.c.finished)
            .limit(limit)
        ).scalars()
    )
    if ids:
        ctx.conn.execute(
            update(jobs)
            .where(jobs.c.id.in_(ids))
            .values(output=None, output_expired=True, revision=jobs.c.revision + 1)
        )
    return ids
