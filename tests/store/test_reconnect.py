"""A dropped MySQL connection costs no write: the writer reconnects and runs the batch again."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from broker.store import open_store
from pool_manager.states import JobState
from tests.store.builders import make_job

pytestmark = pytest.mark.mysql


def kill_connections(url: str) -> int:
    """Kill every server connection to ``url``'s database (the store's writer and readers)."""
    database = make_url(url).database
    engine = sa.create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            ids = conn.execute(
                sa.text(
                    "SELECT id FROM information_schema.processlist "
                    "WHERE db = :db AND id <> CONNECTION_ID()"
                ),
                {"db": database},
            ).scalars()
            killed = 0
            for conn_id in list(ids):
                conn.exec_driver_sql(f"KILL {int(conn_id)}")
                killed += 1
            return killed
    finally:
        engine.dispose()


async def test_writes_survive_a_killed_connection(mysql_url: str) -> None:
    store = await open_store(mysql_url)
    try:
        job = make_job()
        await store.submit(job)
        assert kill_connections(mysql_url) >= 1
        single = make_job()
        assert (await store.submit(single))[1]  # a batch of one: retried on a new connection
        job.state = JobState.RUNNING
        await store.update(job, 0)
        assert kill_connections(mysql_url) >= 1
        assert await store.get_job(single.id) == single
        assert await store.get_job(job.id) == job
    finally:
        await store.close()
