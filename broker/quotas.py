"""Storage quotas: the bytes of packages each caller may keep stored.

A caller's usage is counted from the job store's uploader records (``JobStore.stored_bytes``):
every package it uploaded counts in full, whoever else uploaded the same bytes too (each
uploader may register functions on them, so each keeps them alive; splitting the size between
uploaders would let one caller's usage grow when another's package is collected), and so does
each unexpired upload hold (an authorised upload not finished) of a package it has not
uploaded yet. Sending a package one already uploaded adds nothing. A collected package stops
counting when its rows are deleted (``broker.storage_collection``).

Uploads running at once are each checked against the usage recorded before them, so a caller
can pass its quota by at most what it uploads concurrently; the next upload is then refused.
Event-loop only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from broker.store import JobStore
from functions.errors import QuotaExceeded
from functions.stores import check_digest_syntax


class StorageQuotas:
    """Checks uploads against ``default_bytes``, or a caller's entry in ``overrides``."""

    def __init__(
        self,
        store: JobStore,
        default_bytes: int,
        overrides: Mapping[str, int],
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._default = default_bytes
        self._overrides = dict(overrides)
        self._clock = clock

    def limit_for(self, caller: str) -> int:
        """``caller``'s quota in bytes."""
        return self._overrides.get(caller, self._default)

    async def check(self, caller: str, incoming_bytes: int, digest: str | None = None) -> None:
        """``QuotaExceeded`` when ``caller``'s stored bytes plus ``incoming_bytes`` pass its
        quota. ``digest``: the package being sent, which adds nothing when ``caller`` already
        uploaded it (``InvalidRequest`` when it is not a digest). Nothing incoming is always
        allowed."""
        if incoming_bytes < 0:
            raise ValueError("incoming_bytes must be >= 0")
        if digest is not None:
            check_digest_syntax(digest)  # a malformed one is refused as such, quota or not
        if digest is not None and await self._store.uploaded_by(digest, caller):
            incoming_bytes = 0
        if incoming_bytes == 0:  # nothing new to keep: allowed even to a caller over quota
            return
        limit = self.limit_for(caller)
        used = await self._store.stored_bytes(caller, self._clock())
        if used + incoming_bytes > limit:
            raise QuotaExceeded(
                f"caller {caller!r} stores {used} bytes of packages; {incoming_bytes} more "
                f"would pass its storage quota of {limit} bytes (delete functions to free "
                "their packages after the grace period, or ask the operator for more: "
                "FIREPOOL_STORAGE_QUOTAS)"
            )
