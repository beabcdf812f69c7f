"""Durability settings: SQLite runs in WAL with synchronous=FULL on every connection."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from broker.store import StoreSettings
from broker.store.engine import make_engines


def test_sqlite_connections_are_wal_and_fully_synchronous(tmp_path: Path) -> None:
    write, read = make_engines(f"sqlite:///{tmp_path}/sub/dir/jobs.db", StoreSettings())
    try:
        for engine in (write, read):
            with engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2  # FULL
                assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    finally:
        read.dispose()
        write.dispose()
    assert (tmp_path / "sub" / "dir" / "jobs.db").exists()


def test_the_sqlite_writer_takes_the_write_lock_when_its_transaction_begins(
    tmp_path: Path,
) -> None:
    write, read = make_engines(f"sqlite:///{tmp_path}/jobs.db", StoreSettings(busy_timeout_s=0))
    try:
        # BEGIN IMMEDIATE: while the writer's transaction is open nobody else can write
        with (
            write.connect() as writer,
            writer.begin(),
            read.connect() as other,
            pytest.raises(OperationalError, match="locked"),
        ):
            other.exec_driver_sql("CREATE TABLE t (x INTEGER)")
    finally:
        read.dispose()
        write.dispose()
