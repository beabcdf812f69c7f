"""Fixtures for the job store contract tests: every test runs against SQLite and MySQL.

MySQL tests read ``FIREPOOL_TEST_MYSQL_URL`` (a server URL; its database part is ignored) and
skip with a visible reason without it. With ``FIREPOOL_REQUIRE_MYSQL=1`` an unreachable server
FAILS them. Each run creates and drops its own databases ``firepool_t_<random>`` (one at head
shared by the contract tests and emptied before each; a fresh one per schema test), so
concurrent runs never collide.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from broker.store import JobStore, migrate, open_store
from tests.conftest import scratch_database


@pytest.fixture(scope="session")
def mysql_session_url(mysql_server_url: str) -> Iterator[str]:
    """One database at the newest schema for this test run (creating one per test is slow)."""
    with scratch_database(mysql_server_url) as url:
        migrate(url)
        yield url


def _emptied(url: str) -> str:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.begin() as conn:
            for table in ("jobs", "functions", "packages", "package_uploaders", "package_holds"):
                conn.exec_driver_sql(f"DELETE FROM {table}")
    finally:
        engine.dispose()
    return url


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def store_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """The URL of a database at the newest schema with no rows (SQLite: a new file, created
    on open), once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jobs.db"
    return _emptied(str(request.getfixturevalue("mysql_session_url")))


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def empty_url(request: pytest.FixtureRequest, tmp_path: Any) -> str:
    """The URL of an empty database (no tables at all), once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jobs.db"
    return str(request.getfixturevalue("mysql_url"))


@pytest.fixture
async def store(store_url: str) -> AsyncIterator[JobStore]:
    opened = await open_store(store_url)
    try:
        yield opened
    finally:
        await opened.close()
