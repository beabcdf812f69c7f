"""Errors the job store raises besides the shared typed errors in ``functions.errors``.

``StaleRevision`` is a ``Conflict``: the caller's copy of a job is older than the stored row, so
its compare-and-set did not apply and nothing was written. ``SchemaError`` means the database
schema is not the one this code was written for; ``ForeignDatabase``, a ``SchemaError``, that
the database is not Firepool's at all (``schema.py`` says which are). Both are raised at open
time, never later.
"""

from __future__ import annotations

from functions.errors import Conflict


class StaleRevision(Conflict):
    """The row's revision differs from ``expected_revision``; the update wrote nothing."""

    def __init__(self, job_id: str, expected: int, actual: int) -> None:
        super().__init__(f"job {job_id} is at revision {actual}, not {expected}")
        self.job_id = job_id
        self.expected = expected
        self.actual = actual


class SchemaError(RuntimeError):
    """The database schema is older or newer than this code, or not a Firepool schema."""


class ForeignDatabase(SchemaError):
    """The database holds tables but is not Firepool's (``broker.store.schema``): it is never
    written to."""
