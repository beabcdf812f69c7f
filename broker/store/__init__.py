"""The durable job store: jobs, function versions and packages over SQLite or MySQL.

See ``store.py`` for the API and its concurrency rule, ``writer.py`` for group commit and
``schema.py`` for schema versions. ``docs/store.md`` is the operator's page.
"""

from broker.store.errors import ForeignDatabase, SchemaError, StaleRevision
from broker.store.schema import check_store, migrate
from broker.store.settings import StoreSettings
from broker.store.store import JobStore, open_store
from broker.store.writer import WriterStats

__all__ = [
    "ForeignDatabase",
    "JobStore",
    "SchemaError",
    "StaleRevision",
    "StoreSettings",
    "WriterStats",
    "check_store",
    "migrate",
    "open_store",
]
