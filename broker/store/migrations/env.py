"""Alembic environment for the job store.

Runs only programmatically: ``broker.store.schema`` passes an open connection in
``config.attributes["connection"]``, so no ``alembic.ini`` and no URL in a config file.
"""

from __future__ import annotations

from alembic import context

from broker.store.tables import Base


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if connection is None:
        raise RuntimeError(
            "run job store migrations with `firepool migrate` (broker.store.schema.migrate)"
        )
    context.configure(connection=connection, target_metadata=Base.metadata)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported")
run_migrations_online()
