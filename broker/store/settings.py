"""Job store settings: a frozen dataclass read once at startup, each field documented."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """How the job store connects, batches and retains data."""

    busy_timeout_s: float = 5.0
    """SQLite: how long a statement waits for another process's lock before failing."""

    max_batch: int = 2048
    """Most writes the group-commit writer puts in one transaction."""

    read_pool_size: int = 4
    """Connections kept for reads (each read runs in a worker thread on its own connection)."""

    idempotency_retention_s: float | None = 24 * 3600.0
    """How long an ``Idempotency-Key`` deduplicates, from the first job's submit time to the new
    request's; None: forever. After it, the same key and caller create a new job (the old job
    gives the key up in the same transaction)."""

    result_retention_s: float | None = 7 * 24 * 3600.0
    """How long a finished job keeps its output (and its logs, which the executor deletes for
    the ids ``JobStore.expire`` returns); None: forever. After it the job's output is gone and
    it reports ``output_expired``, which the API answers with error class ``Expired``."""

    max_statement_bytes: int | None = None
    """Largest statement the store takes (values as sent, escapes included); a job record
    that would not fit is refused with ``TooLarge`` before it is sent (at submit: a 413; a
    finished job's outcome: the job fails ``TooLarge``) instead of breaking the connection.
    None: MySQL's ``max_allowed_packet`` as the server reports it at open; no limit on
    SQLite."""

    def __post_init__(self) -> None:
        if self.busy_timeout_s < 0:
            raise ValueError("busy_timeout_s must be >= 0")
        if self.max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        if self.read_pool_size < 1:
            raise ValueError("read_pool_size must be >= 1")
        if self.max_statement_bytes is not None and self.max_statement_bytes < 65536:
            raise ValueError("max_statement_bytes must be >= 65536 or None")
        for name in ("idempotency_retention_s", "result_retention_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 or None")
