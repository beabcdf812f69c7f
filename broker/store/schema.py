"""Schema version checks and migrations (Alembic, run programmatically).

``ensure_schema`` runs once when a store opens, before the writer starts, and ``firepool
serve`` runs ``check_store`` before anything else starts. Whose database it is:

- *empty*: no tables, or only an empty ``alembic_version``: Firepool creates its schema;
- *Firepool's*: ``alembic_version`` holds exactly one revision in Firepool's numbering (four
  digits, ``0001`` up) and the database has the ``jobs`` table (every Firepool schema has);
- *not Firepool's*: anything else: tables without a schema version, several versions, another
  application's Alembic revision, or Firepool's numbering without Firepool's ``jobs`` table.
  Always refused (``ForeignDatabase``), naming a table, never written to.

A Firepool database at head is used as it is; at a known older revision it raises
``SchemaError`` telling the operator to run ``firepool migrate``, unless ``migrate=True``,
which upgrades it; at a revision above this code's head (written by a newer Firepool) it
always raises ``SchemaError``. Messages do not name the database: callers do (the CLI shows
its URL without the password).

``migrate(url)`` is what ``firepool migrate`` calls. Migrations take the DDL locks the backend
takes; run them with brokers stopped.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from broker.store.engine import make_engines
from broker.store.errors import ForeignDatabase, SchemaError
from broker.store.settings import StoreSettings

if TYPE_CHECKING:
    from alembic.config import Config

# Alembic's INFO lines about loading its own plugins say nothing to an operator (its
# "Running upgrade" lines stay).
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

HEAD_REVISION = "0005"
"""The newest migration, known without importing Alembic (about half a second of a broker's
restart); a test keeps it equal to the migrations directory's head."""


def _config(connection: Connection | None = None) -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest revision in the migrations directory (imports Alembic)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None, "the migrations directory has no revisions"
    return head


FIREPOOL_REVISION = re.compile(r"[0-9]{4}")
"""How Firepool names its migrations' revisions: ``0001``, ``0002``, ... in order."""
MARKER_TABLE = "jobs"
"""A table every Firepool schema has (made by ``0001``)."""
FOREIGN_TABLES_SHOWN = 3
"""How many of a foreign database's tables a refusal names."""


def current_revision(conn: Connection) -> str | None:
    """The database's Alembic revision, or None when it has none (or several)."""
    versions = _versions(conn)
    return versions[0] if versions is not None and len(versions) == 1 else None


def _versions(conn: Connection) -> list[str] | None:
    """Every row of ``alembic_version``; None without that table."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return [str(v) for v in conn.execute(text("SELECT version_num FROM alembic_version")).scalars()]


def _foreign(tables: set[str], why: str) -> ForeignDatabase:
    shown = sorted(tables - {"alembic_version"}) or sorted(tables)
    named = ", ".join(shown[:FOREIGN_TABLES_SHOWN])
    extra = len(shown) - FOREIGN_TABLES_SHOWN
    more = f" and {extra} more" if extra > 0 else ""
    count = f"{len(shown)} table{'s' if len(shown) != 1 else ''}"
    return ForeignDatabase(
        f"not Firepool's: the database holds {count} ({named}{more}) but {why}; point "
        "the job store at an empty database (Firepool creates its tables) or one Firepool made"
    )


def ensure_schema(engine: Engine, *, migrate: bool) -> None:
    """Create, accept, upgrade or refuse the schema behind ``engine`` (see module docstring).
    The common case, a Firepool database at head, needs no Alembic import."""
    with engine.connect() as conn:
        versions = _versions(conn)
        current = versions[0] if versions is not None and len(versions) == 1 else None
        if current == HEAD_REVISION and inspect(conn).has_table(MARKER_TABLE):
            return
        tables = set(inspect(conn).get_table_names())
    if not versions:  # no version table, or an empty one
        if tables - {"alembic_version"}:
            raise _foreign(tables, "no Firepool schema version")
        _upgrade(engine)
        return
    if current is None:
        raise _foreign(tables, f"several schema versions ({', '.join(sorted(versions))})")
    if not FIREPOOL_REVISION.fullmatch(current):
        raise _foreign(tables, f"another application's schema version ({current!r})")
    if MARKER_TABLE not in tables:
        raise _foreign(tables, f"no {MARKER_TABLE!r} table at schema version {current}")
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_config())
    head = head_revision()
    if current == head:
        return
    known = {rev.revision for rev in script.walk_revisions()}
    if current > head:
        raise SchemaError(
            f"its schema is at revision {current}, newer than this Firepool (which knows "
            f"up to {head}): a newer Firepool made it; run that version or a newer one"
        )
    if current not in known:
        raise _foreign(tables, f"schema version {current}, which no Firepool made")
    if not migrate:
        raise SchemaError(
            f"its schema is at revision {current}, older than {head}; "
            "run `firepool migrate` (with the brokers stopped)"
        )
    _upgrade(engine)


def check_store(url: str) -> None:
    """What ``open_store`` checks and does to the schema, on its own: run before a broker
    starts anything, so a database that is not Firepool's (or of another schema version) is
    refused before the first pod or request (``firepool serve``). Creates the schema in an
    empty database; raises ``SchemaError`` (``ForeignDatabase``), or SQLAlchemy's error for a
    database that does not answer or a file that is not a database."""
    _ensure_at(url, migrate=False)


def upgrade_to(engine: Engine, revision: str) -> None:
    """Upgrade to ``revision`` (tests use it to build older schemas)."""
    _upgrade(engine, revision)


def _upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    with engine.connect() as conn:
        command.upgrade(_config(conn), revision)
        conn.commit()


def migrate(url: str) -> None:
    """Bring the database at ``url`` to head: create an empty one, upgrade an older one.

    Raises ``SchemaError`` for a schema newer than this code, ``ForeignDatabase`` for a
    database that is not Firepool's.
    """
    _ensure_at(url, migrate=True)


def _ensure_at(url: str, migrate: bool) -> None:
    """``ensure_schema`` on engines of their own for ``url``, disposed after."""
    write, read = make_engines(url, StoreSettings())
    try:
        ensure_schema(read, migrate=migrate)
    finally:
        read.dispose()
        write.dispose()
