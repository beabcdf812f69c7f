"""The durable job store: jobs, function versions and packages over SQLite or MySQL.

See ``store.py`` for the API and its concurrency rule, ``writer.py`` for group commit and
``schema.py`` for schema versions. ``docs/store.md`` is the operator's page.
"""

from gateway.store.errors import SchemaError, StaleRevision
from gateway.store.schema import migrate
from gateway.store.settings import StoreSettings
from gateway.store.store import JobStore, open_store
from gateway.store.writer import WriterStats

__all__ = [
    "JobStore",
    "SchemaError",
    "StaleRevision",
    "StoreSettings",
    "WriterStats",
    "migrate",
    "open_store",
]
