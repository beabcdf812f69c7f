"""Hot-path job statements, compiled once per dialect and run on the DBAPI cursor.

Inserting a job and compare-and-setting a job are most of what the store does (three writes
per dispatched job), so they skip SQLAlchemy's per-execution work (about 3x cheaper): the Core
statement is compiled once, and values are bound by name straight into the driver.

Bulk forms, used by ``batching.py`` for writes that commute:
- ``insert_many``: ``executemany`` (SQLite loops in C; PyMySQL sends one multi-row INSERT);
- ``cas_many``: SQLite runs each statement (in-process, cheap); MySQL sends the whole run as one
  multi-statement query and reads each statement's affected-row count, one round trip instead
  of one per job. Values are escaped by the driver exactly as a normal PyMySQL ``execute`` does
  (it interpolates client-side too), so this adds no injection surface.

Runs only on the writer thread.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Dialect, Update, bindparam, insert, literal_column, update
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.expression import ClauseElement

from broker.store.codec import MUTABLE_JOB_COLUMNS
from broker.store.tables import jobs
from pool_manager.states import JOB_TRANSITIONS, TERMINAL_JOB_STATES, JobState

#: A multi-statement query stays under this many bytes (MySQL's max_allowed_packet is larger).
MAX_MULTI_BYTES = 1 << 20


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

    def params(self, values: Mapping[str, Any]) -> Any:
        """``values`` (by bind name) in the shape the driver's paramstyle wants."""
        return values if self._keys is None else [values[k] for k in self._keys]

    def execute(self, cursor: Any, values: Mapping[str, Any]) -> int:
        """Execute with ``values``; return the affected row count."""
        cursor.execute(self.sql, self.params(values))
        return int(cursor.rowcount)


def cas_params(job_id: str, expected_revision: int, values: Mapping[str, Any]) -> dict[str, Any]:
    """Bind values of a compare-and-set of ``job_id`` from ``expected_revision``."""
    params = {f"v_{c}": values[c] for c in MUTABLE_JOB_COLUMNS}
    params["w_id"] = job_id
    params["w_revision"] = expected_revision
    return params


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


class JobStatements:
    """The precompiled job statements for one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        self.multi_statements = dialect.name == "mysql"
        self.insert_job = Prepared(insert(jobs), dialect)
        self.cas = {state: Prepared(_cas_update(state), dialect) for state in JobState}

    def insert_many(self, cursor: Any, rows: Sequence[Mapping[str, Any]]) -> None:
        """Insert every row; any failure (e.g. a duplicate id) raises."""
        if len(rows) == 1:
            self.insert_job.execute(cursor, rows[0])
        else:
            cursor.executemany(self.insert_job.sql, [self.insert_job.params(r) for r in rows])

    def cas_many(self, cursor: Any, items: Sequence[tuple[JobState, dict[str, Any]]]) -> list[int]:
        """Run each ``(target state, cas_params)``; return each statement's affected rows."""
        if not self.multi_statements or len(items) == 1:
            return [self.cas[target].execute(cursor, params) for target, params in items]
        counts: list[int] = []
        chunk: list[str] = []
        size = 0
        for target, params in items:
            prepared = self.cas[target]
            sql = cursor.mogrify(prepared.sql, prepared.params(params))
            if chunk and size + len(sql) > MAX_MULTI_BYTES:
                counts.extend(self._run_multi(cursor, chunk))
                chunk, size = [], 0
            chunk.append(sql)
            size += len(sql) + 2
        counts.extend(self._run_multi(cursor, chunk))
        return counts

    @staticmethod
    def _run_multi(cursor: Any, statements: list[str]) -> list[int]:
        cursor.execute(";\n".join(statements))
        counts = [int(cursor.rowcount)]
        while cursor.nextset():
            counts.append(int(cursor.rowcount))
        if len(counts) != len(statements):
            raise RuntimeError(f"multi-statement returned {len(counts)} of {len(statements)}")
        return counts
