"""The job store's tables as SQLAlchemy 2.0 declarative models.

These models describe the schema at the newest migration; the migrations under
``migrations/versions`` are the authority for how a database gets there (they never import
this module). JSON-valued columns hold orjson text; ``LONGTEXT`` on MySQL, where ``TEXT`` stops
at 64 KiB. Times are epoch seconds as ``DOUBLE`` (MySQL's ``FLOAT`` is single precision).

Invariants: ``jobs.revision`` increases by exactly one per durable change (compare-and-set);
``(caller, idempotency_key)`` is unique while the key is set; a function version row is never
changed except for its ``deleted`` flag.
"""

from __future__ import annotations

from typing import cast

from sqlalchemy import BigInteger, Boolean, Double, Index, Integer, String, Table, Text, text
from sqlalchemy.dialects import mysql
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

#: JSON text; long enough on MySQL for large outputs.
JsonText = Text().with_variant(mysql.LONGTEXT(), "mysql")


class Base(DeclarativeBase):
    """Declarative base of every store table."""


class JobRow(Base):
    """One job (the intent) with its attempts, result and timings."""

    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_submitted", "state", "submitted"),
        Index("ix_jobs_caller_submitted", "caller", "submitted"),
        Index("ix_jobs_submitted", "submitted"),
        Index("ix_jobs_expiry", "output_expired", "finished"),
        Index("uq_jobs_caller_idempotency", "caller", "idempotency_key", unique=True),
        {"mysql_charset": "utf8mb4"},
    )

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    function: Mapped[str] = mapped_column(String(64))
    version: Mapped[int] = mapped_column(Integer)
    caller: Mapped[str] = mapped_column(String(255))
    sku: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))
    revision: Mapped[int] = mapped_column(Integer)
    lease_tag: Mapped[str | None] = mapped_column(String(255))
    queue: Mapped[str] = mapped_column(String(255))
    priority: Mapped[int] = mapped_column(Integer)
    timeout_s: Mapped[float | None] = mapped_column(Double)
    max_retries: Mapped[int] = mapped_column(Integer)
    pods_needed: Mapped[int] = mapped_column(Integer)
    input: Mapped[str] = mapped_column(JsonText)
    output: Mapped[str | None] = mapped_column(JsonText)
    error: Mapped[str | None] = mapped_column(JsonText)
    exit_code: Mapped[int | None] = mapped_column(Integer)
    retries: Mapped[int] = mapped_column(Integer)
    attempts: Mapped[str] = mapped_column(JsonText)
    acquisition: Mapped[str | None] = mapped_column(JsonText)
    submitted: Mapped[float] = mapped_column(Double)
    started: Mapped[float | None] = mapped_column(Double)
    first_instruction: Mapped[float | None] = mapped_column(Double)
    finished: Mapped[float | None] = mapped_column(Double)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(128))
    # set once the retention period cleared the output (migration 0002)
    output_expired: Mapped[bool] = mapped_column(Boolean, default=False)
    # the call asked for a fresh pod of its own (migration 0004)
    single_use: Mapped[bool] = mapped_column(Boolean, default=False)


class FunctionRow(Base):
    """One immutable function version; ``deleted`` hides every version of a name, and
    ``deleted_at`` says when (migration 0004: a package's grace period starts there)."""

    __tablename__ = "functions"
    __table_args__ = (
        Index("ix_functions_package_digest", "package_digest"),
        Index("ix_functions_requirements_digest", "requirements_digest"),
        {"mysql_charset": "utf8mb4"},
    )

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    sku: Mapped[str] = mapped_column(String(64))
    package_digest: Mapped[str] = mapped_column(String(64))
    entrypoint: Mapped[str | None] = mapped_column(String(255))
    command: Mapped[str | None] = mapped_column(JsonText)
    requirements_digest: Mapped[str | None] = mapped_column(String(64))
    env: Mapped[str] = mapped_column(JsonText)
    timeout_s: Mapped[float] = mapped_column(Double)
    max_retries: Mapped[int] = mapped_column(Integer)
    pods: Mapped[int] = mapped_column(Integer)
    single_use: Mapped[bool] = mapped_column(Boolean)
    created: Mapped[float] = mapped_column(Double)
    owner: Mapped[str] = mapped_column(String(255))
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    deleted_at: Mapped[float | None] = mapped_column(Double)


class PackageRow(Base):
    """A content-addressed code package known to the package store."""

    __tablename__ = "packages"
    __table_args__ = ({"mysql_charset": "utf8mb4"},)

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created: Mapped[float] = mapped_column(Double)
    last_uploaded: Mapped[float] = mapped_column(Double, server_default=text("0"))
    """When any caller last uploaded its bytes (migration 0004; the grace period's start)."""


class PackageUploaderRow(Base):
    """A caller who uploaded a package's bytes: only they (or an admin) may register a
    function on it, or learn it is stored (migration 0003). Content addressing dedupes the
    bytes, not the right to use them: knowing a digest is not having the code."""

    __tablename__ = "package_uploaders"
    __table_args__ = (
        Index("ix_package_uploaders_caller", "caller"),
        {"mysql_charset": "utf8mb4"},
    )

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    caller: Mapped[str] = mapped_column(String(255), primary_key=True)
    created: Mapped[float] = mapped_column(Double)


class PackageHoldRow(Base):
    """An upload a caller was authorised to make and has not finished (a presigned PUT):
    until ``expires`` its package is not collected, and its ``size`` counts against the
    caller's storage quota unless the caller is already an uploader of it (migration 0004)."""

    __tablename__ = "package_holds"
    __table_args__ = ({"mysql_charset": "utf8mb4"},)

    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    caller: Mapped[str] = mapped_column(String(255), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    expires: Mapped[float] = mapped_column(Double)


jobs = cast(Table, JobRow.__table__)
functions = cast(Table, FunctionRow.__table__)
packages = cast(Table, PackageRow.__table__)
package_uploaders = cast(Table, PackageUploaderRow.__table__)
package_holds = cast(Table, PackageHoldRow.__table__)
