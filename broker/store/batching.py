"""Merging a batch's job writes into bulk statements (the writer's ``BatchExecutor``).

Writes to *different* jobs commute inside one transaction: nobody can observe their order,
since the batch commits atomically. So when every job write in a batch names a distinct job,
the executor runs all plain submits (no idempotency key) as one bulk insert, then all
compare-and-sets as one bulk run, then every other write (keyed submits, functions, packages,
retention) in its original order. When two writes name the same job, the batch runs strictly
in order instead, one write at a time.

Outcomes come back in the writers' order. A compare-and-set that matched no row is explained
(``StaleRevision``, ``IllegalTransition``, ``NotFound``) as a clean failure of that write only;
any error of a bulk statement raises, so the writer rolls back and replays each write alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from broker.store.statements import JobStatements
from broker.store.writer import Outcome, WriteContext, WriteOp, run_sequentially
from broker.store.writes import SubmitJob, UpdateJob


class JobBatchExecutor:
    """A ``BatchExecutor`` that bulk-executes commuting job writes."""

    def __init__(
        self, stmts: JobStatements, clean_failures: tuple[type[BaseException], ...]
    ) -> None:
        self._stmts = stmts
        self._clean = clean_failures

    def __call__(self, ctx: WriteContext, ops: Sequence[WriteOp[Any]]) -> list[Outcome]:
        if len(ops) < 2 or not _distinct_jobs(ops):
            return run_sequentially(ctx, ops, self._clean)
        out: list[Outcome | None] = [None] * len(ops)
        inserts: list[tuple[int, SubmitJob]] = []
        updates: list[tuple[int, UpdateJob]] = []
        rest: list[int] = []
        for i, op in enumerate(ops):
            if isinstance(op, SubmitJob) and op.plain:
                inserts.append((i, op))
            elif isinstance(op, UpdateJob):
                updates.append((i, op))
            else:
                rest.append(i)
        if inserts:
            self._stmts.insert_many(ctx.cursor, [op.row for _, op in inserts])
            for i, _ in inserts:
                out[i] = (True, None)
        if updates:
            items = [(op.target, op.params()) for _, op in updates]
            counts = self._stmts.cas_many(ctx.cursor, items)
            for (i, op), count in zip(updates, counts, strict=True):
                out[i] = (True, None) if count == 1 else self._explain(ctx, op)
        if rest:
            outcomes = run_sequentially(ctx, [ops[i] for i in rest], self._clean)
            for i, outcome in zip(rest, outcomes, strict=True):
                out[i] = outcome
        return [o for o in out if o is not None]

    def _explain(self, ctx: WriteContext, update: UpdateJob) -> Outcome:
        try:
            update.explain_miss(ctx)
        except self._clean as exc:
            return (False, exc)
        raise AssertionError("explain_miss always raises")


def _distinct_jobs(ops: Sequence[WriteOp[Any]]) -> bool:
    ids = [op.job_id for op in ops if isinstance(op, SubmitJob | UpdateJob)]
    return len(ids) == len(set(ids))
