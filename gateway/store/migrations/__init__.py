"""Alembic migrations of the job store, run programmatically by ``gateway.store.schema``."""
