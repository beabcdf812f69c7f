"""The write operations the group-commit writer runs, and their precompiled statements.

Every function here runs on the writer thread inside a batch transaction (see ``writer.py``)
and follows its contract: it either completes, or raises a *clean* failure (``StaleRevision``,
``IllegalTransition``, ``NotFound``, ``IdempotencyMismatch``) before changing anything, or
raises anything else and lets the batch roll back and replay entry by entry.

The hot path (insert a job, compare-and-set a job) uses Core statements compiled once for the
dialect and executed on the DBAPI cursor, skipping SQLAlchemy's per-execution overhead (about
3x cheaper); everything else uses ordinary Core execution.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from sqlalchemy import (
    Dialect,
    Update,
    bindparam,
    false,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from functions.errors import IdempotencyMismatch, NotFound
from gateway.store.codec import MUTABLE_JOB_COLUMNS
from gateway.store.errors import StaleRevision
from gateway.store.tables import functions, jobs, packages
from gateway.store.writer import WriteContext
from pool_manager.states import JOB_TRANSITIONS, TERMINAL_JOB_STATES, IllegalTransition, JobState


def allowed_sources(target: JobState) -> frozenset[JobState]:
    """States a job may be in for an update to leave it in ``target``: every state with an edge
    to ``target`` in ``JOB_TRANSITIONS``, plus ``target`` itself when it is not terminal (a
    field update without a transition, e.g. recording ``first_instruction``)."""
    sources = {s for s, targets in JOB_TRANSITIONS.items() if target in targets}
    if target not in TERMINAL_JOB_STATES:
        sources.add(target)
    return frozenset(sources)


class Prepared:
    """A Core statement compiled once for a dialect, run directly on a DBAPI cursor."""

    def __init__(self, stmt: ClauseElement, dialect: Dialect) -> None:
        compiled = cast(SQLCompiler, stmt.compile(dialect=dialect))
        self.sql = str(compiled)
        self._keys = tuple(compiled.positiontup or ()) if compiled.positional else None

    def execute(self, cursor: Any, values: Mapping[str, Any]) -> int:
        """Execute with ``values`` (by bind name); return the affected row count."""
        if self._keys is None:
            cursor.execute(self.sql, values)
        else:
            cursor.execute(self.sql, [values[k] for k in self._keys])
        return int(cursor.rowcount)


class JobStatements:
    """The precompiled hot-path statements for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self.insert_job = Prepared(insert(jobs), dialect)
        self.cas = {state: Prepared(_cas_update(state), dialect) for state in JobState}


def _cas_update(target: JobState) -> Update:
    sources = sorted(s.value for s in allowed_sources(target))
    values: dict[str, Any] = {c: bindparam(f"v_{c}") for c in MUTABLE_JOB_COLUMNS}
    values["revision"] = jobs.c.revision + literal_column("1")
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("w_id"),
            jobs.c.revision == bindparam("w_revision"),
            # enum constants, not user input: safe to render literally
            jobs.c.state.in_([literal_column(f"'{s}'") for s in sources]),
        )
        .values(values)
    )


def submit_job(
    ctx: WriteContext, stmts: JobStatements, row: dict[str, Any], key_retention_s: float | None
) -> dict[str, Any] | None:
    """Insert a job row; return None, or the stored row when its idempotency key matched.

    A key older than ``key_retention_s`` (measured against the new job's ``submitted``) no
    longer deduplicates: it is released from the old job and the new job takes it.
    """
    key = row["idempotency_key"]
    if key is not None:
        found = (
            ctx.conn.execute(
                select(jobs).where(jobs.c.caller == row["caller"], jobs.c.idempotency_key == key)
            )
            .mappings()
            .first()
        )
        if found is not None:
            expired = (
                key_retention_s is not None
                and found["submitted"] < row["submitted"] - key_retention_s
            )
            if not expired:
                if found["request_hash"] != row["request_hash"]:
                    raise IdempotencyMismatch(
                        "this Idempotency-Key was used with a different request",
                        field="Idempotency-Key",
                    )
                return dict(found)
            ctx.conn.execute(
                update(jobs).where(jobs.c.id == found["id"]).values(idempotency_key=None)
            )
    stmts.insert_job.execute(ctx.cursor, row)
    return None


def update_job(
    ctx: WriteContext,
    stmts: JobStatements,
    job_id: str,
    expected_revision: int,
    values: dict[str, Any],
) -> None:
    """Compare-and-set: write ``values`` iff the row is at ``expected_revision`` and in a state
    from which ``values["state"]`` is allowed; bump the revision by one."""
    params = {f"v_{c}": values[c] for c in MUTABLE_JOB_COLUMNS}
    params["w_id"] = job_id
    params["w_revision"] = expected_revision
    target = JobState(values["state"])
    if stmts.cas[target].execute(ctx.cursor, params) == 1:
        return
    found = ctx.conn.execute(
        select(jobs.c.state, jobs.c.revision).where(jobs.c.id == job_id)
    ).first()
    if found is None:
        raise NotFound(f"job {job_id} does not exist")
    if found.revision != expected_revision:
        raise StaleRevision(job_id, expected_revision, found.revision)
    raise IllegalTransition(f"job {job_id}: {found.state} -> {target} is not allowed")


def put_function(ctx: WriteContext, row: dict[str, Any]) -> int:
    """Insert ``row`` as version latest + 1 of its name (deleted versions count); return it."""
    latest = ctx.conn.execute(
        select(func.max(functions.c.version)).where(functions.c.name == row["name"])
    ).scalar()
    version = (latest or 0) + 1
    ctx.conn.execute(insert(functions).values({**row, "version": version}))
    return version


def delete_function(ctx: WriteContext, name: str) -> bool:
    """Hide every version of ``name``; True if some version was live."""
    result = ctx.conn.execute(
        update(functions)
        .where(functions.c.name == name, functions.c.deleted.is_(False))
        .values(deleted=True)
    )
    return result.rowcount > 0


def put_package(ctx: WriteContext, digest: str, size: int, created: float) -> None:
    """Record a package once; a digest already known is left as it is."""
    known = ctx.conn.execute(select(packages.c.digest).where(packages.c.digest == digest)).first()
    if known is None:
        ctx.conn.execute(insert(packages).values(digest=digest, size=size, created=created))


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
