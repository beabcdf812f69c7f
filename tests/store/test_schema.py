"""Schema versions: new databases start at head; older ones need `firepool migrate`;
newer or foreign ones are refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from broker.store import SchemaError, StoreSettings, migrate, open_store
from broker.store.codec import job_row
from broker.store.engine import make_engines
from broker.store.schema import current_revision, head_revision, upgrade_to
from tests.store.builders import make_job


def revision_of(url: str) -> str | None:
    write, read = make_engines(url, StoreSettings())
    try:
        with read.connect() as conn:
            return current_revision(conn)
    finally:
        read.dispose()
        write.dispose()


def run_sql(url: str, *statements: str) -> None:
    write, read = make_engines(url, StoreSettings())
    try:
        with read.begin() as conn:
            for stmt in statements:
                conn.exec_driver_sql(stmt)
    finally:
        read.dispose()
        write.dispose()


async def test_an_empty_database_is_created_at_head(empty_url: str) -> None:
    store = await open_store(empty_url)
    await store.close()
    assert revision_of(empty_url) == head_revision()


async def test_an_older_schema_needs_migrate_and_keeps_its_jobs(empty_url: str) -> None:
    write, read = make_engines(empty_url, StoreSettings())
    job = make_job()
    try:
        upgrade_to(read, "0001")
        later = {"output_expired", "single_use"}  # columns of migrations 0002 and 0005
        row = {k: v for k, v in job_row(job).items() if k not in later}
        old_jobs = sa.table("jobs", *(sa.column(k) for k in row))
        with read.begin() as conn:
            conn.execute(sa.insert(old_jobs).values(row))
    finally:
        read.dispose()
        write.dispose()
    with pytest.raises(SchemaError, match="firepool migrate"):
        await open_store(empty_url)
    store = await open_store(empty_url, migrate=True)
    try:
        assert await store.get_job(job.id) == job
    finally:
        await store.close()
    assert revision_of(empty_url) == head_revision()


async def test_migration_0003_makes_each_function_s_owner_an_uploader_of_its_files(
    empty_url: str,
) -> None:
    """Packages got owners in 0003; whoever registered a function on a package before keeps
    the right to use it (and nobody else gets it)."""
    write, read = make_engines(empty_url, StoreSettings())
    try:
        upgrade_to(read, "0002")
        insert = sa.text(
            "INSERT INTO functions (name, version, sku, package_digest, entrypoint, command, "
            "requirements_digest, env, timeout_s, max_retries, pods, single_use, created, "
            "owner, deleted) VALUES (:name, :version, 'cpu', :package, 'm:f', NULL, :req, "
            "'{}', 1, 0, 1, 0, 0, :owner, 0)"
        )
        old = [("alice", "r" * 64), ("alice", None), ("bob", None)]
        with read.begin() as conn:
            for version, (owner, req) in enumerate(old, start=1):
                row = {"name": f"f-{owner}", "version": version, "package": "p" * 64}
                conn.execute(insert, {**row, "req": req, "owner": owner})
    finally:
        read.dispose()
        write.dispose()
    store = await open_store(empty_url, migrate=True)
    try:
        assert await store.uploaded_by("p" * 64, "alice")
        assert await store.uploaded_by("r" * 64, "alice")
        assert await store.uploaded_by("p" * 64, "bob")
        assert not await store.uploaded_by("r" * 64, "bob")
        assert not await store.uploaded_by("p" * 64, "carol")
    finally:
        await store.close()


async def test_a_newer_schema_is_always_refused(empty_url: str) -> None:
    migrate(empty_url)
    run_sql(empty_url, "UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(SchemaError, match="newer"):
        await open_store(empty_url)
    with pytest.raises(SchemaError, match="newer"):
        await open_store(empty_url, migrate=True)


async def test_a_database_with_foreign_tables_is_refused(empty_url: str) -> None:
    run_sql(empty_url, "CREATE TABLE someone_elses (id INTEGER PRIMARY KEY)")
    with pytest.raises(SchemaError, match="no Firepool schema version"):
        await open_store(empty_url, migrate=True)


async def test_migrate_creates_then_is_a_no_op(empty_url: str) -> None:
    migrate(empty_url)
    migrate(empty_url)
    assert revision_of(empty_url) == head_revision()
    store = await open_store(empty_url)
    await store.close()


def test_an_in_memory_sqlite_database_is_refused() -> None:
    with pytest.raises(ValueError, match="in-memory"):
        make_engines("sqlite://", StoreSettings())


async def test_the_models_match_the_migrated_schema(empty_url: str) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    from broker.store.tables import Base

    migrate(empty_url)
    write, read = make_engines(empty_url, StoreSettings())
    try:
        with read.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    finally:
        read.dispose()
        write.dispose()
    assert diff == []


def test_the_head_revision_constant_matches_the_migrations_directory() -> None:
    from broker.store.schema import HEAD_REVISION, head_revision

    assert head_revision() == HEAD_REVISION


async def test_a_new_sqlite_store_is_owner_only_wherever_it_lives(tmp_path: Path) -> None:
    """A store outside the 0700 home was made 0644 in 0755 folders: any local user could
    read every job's input and output (new-user run)."""
    db = tmp_path / "elsewhere" / "jobs.db"
    store = await open_store(f"sqlite:///{db}")
    try:
        assert await store.get_job("none") is None
    finally:
        await store.close()
    assert db.parent.stat().st_mode & 0o777 == 0o700
    for path in [db, *db.parent.glob("jobs.db-*")]:
        assert path.stat().st_mode & 0o077 == 0, (path, oct(path.stat().st_mode))
