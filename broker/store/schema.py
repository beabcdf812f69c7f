"""Schema version checks and migrations (Alembic, run programmatically).

``ensure_schema`` runs once when a store opens, before the writer starts:
- an empty database (no tables at all) is created at head;
- a database at head is used as it is;
- a database at a known older revision raises ``SchemaError`` telling the operator to run
  ``firepool migrate``, unless ``migrate=True``, which upgrades it;
- a database at a revision this code does not know (written by newer code), or with tables but
  no Alembic version, always raises ``SchemaError``.

``migrate(url)`` is what ``firepool migrate`` calls. Migrations take the DDL locks the backend
takes; run them with brokers stopped.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text

from broker.store.engine import make_engines
from broker.store.errors import SchemaError
from broker.store.settings import StoreSettings

if TYPE_CHECKING:
    from alembic.config import Config

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


def current_revision(conn: Connection) -> str | None:
    """The database's Alembic revision, or None when it has none."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return rows[0] if len(rows) == 1 else None


def ensure_schema(engine: Engine, *, migrate: bool) -> None:
    """Create, accept, upgrade or refuse the schema behind ``engine`` (see module docstring).
    The common case, a database already at head, needs no Alembic import."""
    with engine.connect() as conn:
        current = current_revision(conn)
        if current == HEAD_REVISION:
            return
        tables = set(inspect(conn).get_table_names())
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(_config())
    head = head_revision()
    if current == head:
        return
    if current is None:
        if tables - {"alembic_version"}:
            raise SchemaError(
                f"{engine.url.render_as_string(hide_password=True)} holds tables "
                f"({', '.join(sorted(tables))}) but no Firepool schema version; "
                "point the job store at an empty database"
            )
        _upgrade(engine)
        return
    known = {rev.revision for rev in script.walk_revisions()}
    if current not in known:
        raise SchemaError(
            f"the job store schema is at revision {current}, newer than this Firepool "
            f"(which knows up to {head}); upgrade Firepool"
        )
    if not migrate:
        raise SchemaError(
            f"the job store schema is at revision {current}, older than {head}; "
            "run `firepool migrate` (with the brokers stopped)"
        )
    _upgrade(engine)


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

    Raises ``SchemaError`` for a schema newer than this code or a non-Firepool database.
    """
    write, read = make_engines(url, StoreSettings())
    try:
        ensure_schema(read, migrate=True)
    finally:
        read.dispose()
        write.dispose()
