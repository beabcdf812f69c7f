"""A broker started on a database that is not Firepool's, or of another Firepool schema version,
ends with one ``error:`` line and exit 2 before anything starts, and leaves the database as it
was; on SQLite and on MySQL/MariaDB (``FIREPOOL_TEST_MYSQL_URL``; skipped with the reason
without it, failed under ``FIREPOOL_REQUIRE_MYSQL=1``). What "not Firepool's" means is
``broker.store.schema``'s docstring; an empty database is served (``test_broker_stores``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect
from sqlalchemy.pool import NullPool

from broker.store import migrate
from broker.store.schema import HEAD_REVISION, upgrade_to
from gateway.harness import REPO, free_port, kill_pods
from tests.conftest import ALLOW_UNSANDBOXED_ENV, scratch_database

FOREIGN = (
    "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER)",
    "CREATE TABLE customers (id INTEGER PRIMARY KEY, name VARCHAR(40))",
    "INSERT INTO invoices VALUES (1, 100)",
)


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty database, once per backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/other.db"
        return
    with scratch_database(request.getfixturevalue("mysql_server_url")) as url:
        yield url


def run_sql(url: str, *statements: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        engine.dispose()


def tables_and_rows(url: str) -> dict[str, list[tuple[object, ...]]]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            names = sorted(inspect(conn).get_table_names())
            return {
                name: [tuple(r) for r in conn.exec_driver_sql(f"SELECT * FROM {name}")]
                for name in names
            }
    finally:
        engine.dispose()


def firepool(tmp_path: Path, url: str, *argv: str) -> subprocess.CompletedProcess[str]:
    """``firepool ARGV`` on the store at ``url`` with a fresh home (0700: no warning about
    it), as the operator runs it."""
    home = tmp_path / "home"
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("FIREPOOL_") or k == ALLOW_UNSANDBOXED_ENV
    }
    env.update(PYTHONPATH=str(REPO), FIREPOOL_HOME=str(home), FIREPOOL_STORE_URL=url)
    if argv[0] == "serve":
        argv = (*argv, "--host", "127.0.0.1", "--port", str(free_port()))
    try:
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli", *argv],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        kill_pods(home)  # none should have started; a broker that served would leave some


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert proc.stderr.startswith("error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return proc.stderr


@pytest.mark.parametrize("command", ["serve", "migrate"])
def test_a_database_of_someone_else_s_tables_is_refused_and_left_alone(
    command: str, db_url: str, tmp_path: Path
) -> None:
    run_sql(db_url, *FOREIGN)
    before = tables_and_rows(db_url)
    err = one_error_line(firepool(tmp_path, db_url, command))
    assert "(FIREPOOL_STORE_URL): not Firepool's: the database holds 2 tables" in err, err
    assert "(customers, invoices) but no Firepool schema version" in err, err
    assert "point the job store at an empty database" in err, err
    assert tables_and_rows(db_url) == before  # no Firepool table, no version row added


def test_another_application_s_alembic_database_is_not_firepool_s(
    db_url: str, tmp_path: Path
) -> None:
    """An ``alembic_version`` is no proof: another application's revision is refused as not
    Firepool's, not as a schema a newer Firepool made."""
    run_sql(
        db_url,
        *FOREIGN,
        "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
        "INSERT INTO alembic_version VALUES ('ae1027a6acf')",
    )
    before = tables_and_rows(db_url)
    err = one_error_line(firepool(tmp_path, db_url, "serve"))
    assert "not Firepool's" in err and "another application's schema version ('ae1027a6acf')" in err
    assert tables_and_rows(db_url) == before


def test_firepool_s_numbering_without_firepool_s_tables_is_not_firepool_s(
    db_url: str, tmp_path: Path
) -> None:
    run_sql(
        db_url,
        *FOREIGN,
        "CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL PRIMARY KEY)",
        f"INSERT INTO alembic_version VALUES ('{HEAD_REVISION}')",
    )
    err = one_error_line(firepool(tmp_path, db_url, "serve"))
    assert "not Firepool's" in err and f"no 'jobs' table at schema version {HEAD_REVISION}" in err


def test_a_schema_a_newer_firepool_made_is_refused(db_url: str, tmp_path: Path) -> None:
    migrate(db_url)
    run_sql(db_url, "UPDATE alembic_version SET version_num = '9999'")
    err = one_error_line(firepool(tmp_path, db_url, "serve"))
    assert f"revision 9999, newer than this Firepool (which knows up to {HEAD_REVISION})" in err


def test_an_older_schema_asks_for_migrate(db_url: str, tmp_path: Path) -> None:
    engine = create_engine(db_url, poolclass=NullPool)
    try:
        upgrade_to(engine, "0001")
    finally:
        engine.dispose()
    err = one_error_line(firepool(tmp_path, db_url, "serve"))
    assert "older than" in err and "run `firepool migrate`" in err, err


def test_a_sqlite_file_that_is_no_database_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are not the jobs you are looking for\n" * 100)
    err = one_error_line(firepool(tmp_path, f"sqlite:///{path}", "serve"))
    assert "file is not a database" in err, err
