"""Alembic migrations of the job store, run programmatically by ``broker.store.schema``."""
