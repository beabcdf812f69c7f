"""Engine setup for the two supported backends.

Two engines per store: the *write* engine gives the group-commit writer its one connection;
the *read* engine pools connections for reads run in worker threads.

SQLite: WAL journal (readers never block the writer, nor it them), ``synchronous=FULL`` (a
commit survives power loss), ``busy_timeout`` for other processes' locks. The writer's
transactions start with ``BEGIN IMMEDIATE`` so the write lock is taken up front and a
read-then-write inside a batch cannot be overtaken by another process. In-memory databases are
refused: each connection would see a different one.

MySQL/MariaDB (PyMySQL): default durability (``innodb_flush_log_at_trx_commit`` as the server
says), pre-ping and recycle on the read pool; the writer reconnects after a disconnect, and its
connection (only it) allows multi-statement queries for bulk compare-and-sets.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url

from broker.store.settings import StoreSettings


def backend_of(url: str | URL) -> str:
    """``sqlite`` or ``mysql``; anything else raises ValueError."""
    backend = make_url(url).get_backend_name()
    if backend not in ("sqlite", "mysql"):
        raise ValueError(f"unsupported job store backend {backend!r} (use sqlite or mysql)")
    return backend


def make_engines(url: str, settings: StoreSettings) -> tuple[Engine, Engine]:
    """Return ``(write_engine, read_engine)`` for ``url``."""
    parsed = make_url(url)
    if backend_of(parsed) == "sqlite":
        return _sqlite_engines(parsed, settings)
    return _mysql_engines(parsed, settings)


def sqlite_file(url: str | URL) -> Path:
    """The file a SQLite URL names, absolute: ``sqlite:///path`` or its URI form
    ``sqlite:///file:path?uri=true`` (whose ``database`` is ``file:path``, not a path)."""
    parsed = make_url(url)
    name = parsed.database or ""
    if str(parsed.query.get("uri", "")).lower() in ("true", "1") and name.startswith("file:"):
        name = name[len("file:") :].partition("?")[0]
    return Path(name).expanduser().resolve()


def _private_file(path: Path) -> None:
    """Create the store's file owner-only (0600, in a new 0700 folder) if it does not exist:
    SQLite would make it 0644, so a store outside the 0700 home would let any local user read
    every job's input and output. SQLite gives its ``-wal`` and ``-shm`` files the same
    mode. An existing file is left as its owner made it."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))


def _sqlite_engines(url: URL, settings: StoreSettings) -> tuple[Engine, Engine]:
    if not url.database or url.database == ":memory:" or url.query.get("mode") == "memory":
        raise ValueError("the job store needs a SQLite file, not an in-memory database")
    _private_file(sqlite_file(url))
    busy_ms = int(settings.busy_timeout_s * 1000)

    def pragmas(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={busy_ms}")
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=FULL")
        finally:
            cursor.close()

    write = create_engine(url, pool_size=1, max_overflow=0)
    read = create_engine(url, pool_size=settings.read_pool_size, max_overflow=8)
    event.listen(write, "connect", pragmas)
    event.listen(read, "connect", pragmas)

    @event.listens_for(write, "connect")
    def _driver_autocommit(dbapi_conn: Any, _record: Any) -> None:
        # let SQLAlchemy's "begin" event, not the driver, open transactions
        dbapi_conn.isolation_level = None

    @event.listens_for(write, "begin")
    def _begin_immediate(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return write, read


def _mysql_engines(url: URL, settings: StoreSettings) -> tuple[Engine, Engine]:
    from pymysql.constants import CLIENT

    write = create_engine(url, pool_size=1, max_overflow=0, pool_pre_ping=True)

    @event.listens_for(write, "do_connect")
    def _multi_statements(_dialect: Any, _rec: Any, _args: Any, params: dict[str, Any]) -> None:
        # the writer sends a batch's compare-and-sets in one round trip (statements.py)
        params["client_flag"] = params.get("client_flag", 0) | CLIENT.MULTI_STATEMENTS

    read = create_engine(
        url,
        pool_size=settings.read_pool_size,
        max_overflow=8,
        pool_pre_ping=True,
        pool_recycle=3600,
        isolation_level="READ COMMITTED",
    )
    return write, read
