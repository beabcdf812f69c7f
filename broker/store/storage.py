"""The job store's side of storage collection and quotas: which packages may go, upload holds,
and the bytes each caller stores.

A package may be forgotten (its rows deleted, then its bytes by ``broker.storage_collection``)
at ``now`` only when, with ``cutoff = now - grace_s``:
- no live function version names it (as its package or its requirements file);
- no version deleted after ``cutoff`` names it (a version deleted without a time, too);
- no job that has not ended names a version that names it (a queued job of a deleted
  function must still find its bytes at its turn, or fail for the deletion, not for them);
- it was not uploaded after ``cutoff`` (``packages.last_uploaded``);
- no upload hold on it expires after ``now`` (an authorised upload not finished).

``forget_packages`` checks all of that and deletes the rows in one write on the writer thread,
so a ``put_function``, ``put_package`` or ``hold_package`` is wholly before it (and seen) or
wholly after it. Bytes are the package store's, outside the transaction: the broker keeps its
own registrations and uploads off a digest while it is being collected
(``broker.storage_collection.DigestGuard``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from sqlalchemy import Select, and_, delete, exists, func, insert, or_, select, update

from broker.store.tables import functions, jobs, package_holds, package_uploaders, packages
from broker.store.writer import WriteContext
from pool_manager.states import TERMINAL_JOB_STATES, JobState

IN_CHUNK = 500
"""Most digests or job ids named in one ``IN`` list."""

ACTIVE_STATES = tuple(s.value for s in JobState if s not in TERMINAL_JOB_STATES)
"""Job states whose job may still start an attempt (and fetch its version's packages)."""


def chunks(items: Collection[str]) -> Iterable[list[str]]:
    """``items`` in lists of at most ``IN_CHUNK``."""
    listed = list(items)
    for start in range(0, len(listed), IN_CHUNK):
        yield listed[start : start + IN_CHUNK]


def _kept(ctx: WriteContext, digests: list[str], now: float, cutoff: float) -> set[str]:
    """Which of ``digests`` must stay (module docstring)."""
    conn = ctx.conn
    kept: set[str] = set()
    recently_deleted = or_(
        functions.c.deleted.is_(False),
        functions.c.deleted_at.is_(None),
        functions.c.deleted_at > cutoff,
    )
    for column in (functions.c.package_digest, functions.c.requirements_digest):
        kept.update(
            conn.execute(select(column).where(column.in_(digests), recently_deleted)).scalars()
        )
        active = select(column).join(
            jobs, and_(jobs.c.function == functions.c.name, jobs.c.version == functions.c.version)
        )
        kept.update(
            conn.execute(
                active.where(column.in_(digests), jobs.c.state.in_(ACTIVE_STATES))
            ).scalars()
        )
    kept.update(
        conn.execute(
            select(packages.c.digest).where(
                packages.c.digest.in_(digests), packages.c.last_uploaded > cutoff
            )
        ).scalars()
    )
    kept.update(
        conn.execute(
            select(package_holds.c.digest).where(
                package_holds.c.digest.in_(digests), package_holds.c.expires > now
            )
        ).scalars()
    )
    return kept


def forget_packages(
    ctx: WriteContext, digests: Collection[str], now: float, grace_s: float
) -> list[str]:
    """Of ``digests``, those that may go at ``now`` (module docstring), with their package,
    uploader and hold rows deleted; also deletes every hold that expired by ``now``."""
    conn = ctx.conn
    conn.execute(delete(package_holds).where(package_holds.c.expires <= now))
    forgotten: list[str] = []
    for chunk in chunks(digests):
        going = [d for d in chunk if d not in _kept(ctx, chunk, now, now - grace_s)]
        if not going:
            continue
        for table in (packages, package_uploaders, package_holds):
            conn.execute(delete(table).where(table.c.digest.in_(going)))
        forgotten.extend(going)
    return forgotten


def hold_package(ctx: WriteContext, digest: str, caller: str, size: int, expires: float) -> None:
    """Record that ``caller`` may upload ``size`` bytes of ``digest`` until ``expires``; a hold
    already there keeps the later expiry and takes the new size."""
    held = package_holds.c
    found = ctx.conn.execute(
        select(held.expires).where(held.digest == digest, held.caller == caller)
    ).first()
    if found is None:
        ctx.conn.execute(
            insert(package_holds).values(digest=digest, caller=caller, size=size, expires=expires)
        )
    else:
        ctx.conn.execute(
            update(package_holds)
            .where(held.digest == digest, held.caller == caller)
            .values(size=size, expires=max(expires, found.expires))
        )


def release_hold(ctx: WriteContext, digest: str, caller: str) -> None:
    """Drop ``caller``'s hold on ``digest`` (its upload finished or was given up)."""
    held = package_holds.c
    ctx.conn.execute(delete(package_holds).where(held.digest == digest, held.caller == caller))


def stored_bytes_query(caller: str, now: float) -> Select[Any]:
    """A one-row, one-column query: the bytes counted against ``caller``'s quota at ``now``.
    Every package it uploaded counts in full (a package two callers uploaded counts against
    each), and so does each unexpired hold of a package it has not uploaded yet."""
    uploaded = (
        select(func.coalesce(func.sum(packages.c.size), 0))
        .select_from(
            packages.join(package_uploaders, package_uploaders.c.digest == packages.c.digest)
        )
        .where(package_uploaders.c.caller == caller)
        .scalar_subquery()
    )
    already = exists().where(
        package_uploaders.c.digest == package_holds.c.digest,
        package_uploaders.c.caller == caller,
    )
    held = (
        select(func.coalesce(func.sum(package_holds.c.size), 0))
        .where(package_holds.c.caller == caller, package_holds.c.expires > now, ~already)
        .scalar_subquery()
    )
    return select((uploaded + held).label("used"))


def retained_jobs_query(job_ids: list[str]) -> Select[Any]:
    """The ids among ``job_ids`` of jobs that exist and whose output has not expired."""
    return select(jobs.c.id).where(jobs.c.id.in_(job_ids), jobs.c.output_expired.is_(False))
