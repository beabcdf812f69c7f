"""``MemoryPackageStore``: packages in this process's memory, for fast tests and demos.

Everything is lost when the process ends, and each package costs its size in memory (an upload
in progress too, until it is committed or dropped): not for a broker that must outlive a
restart (``FIREPOOL_PACKAGE_STORE=local``). Pods fetch through the same signed ``/v1/blobs``
URLs as the local store's; the broker's blob route reads the bytes through ``open``. One lock
guards the packages, so every method is safe from any thread.
"""

from __future__ import annotations

import io
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from functions.errors import NotFound
from functions.stores.base import Check, HashingUpload, StoredPackage, check_digest_syntax
from functions.stores.signed_urls import BlobUrls, UrlSigner


@dataclass(frozen=True, slots=True)
class _Blob:
    data: bytes
    stored_at: float


class MemoryPackageStore:
    """A ``PackageStore`` in a dict; ``clock`` stamps ``StoredPackage.stored_at``."""

    def __init__(
        self,
        signer: UrlSigner,
        base_url: str,
        ttl_s: int = 900,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.urls = BlobUrls(signer, base_url, ttl_s)
        self._clock = clock
        self._blobs: dict[str, _Blob] = {}
        self._lock = threading.Lock()

    def upload(self, digest: str) -> MemoryUpload:
        return MemoryUpload(self, digest)

    def exists(self, digest: str) -> bool:
        check_digest_syntax(digest)
        with self._lock:
            return digest in self._blobs

    def open(self, digest: str) -> BinaryIO:
        check_digest_syntax(digest)
        with self._lock:
            blob = self._blobs.get(digest)
        if blob is None:
            raise NotFound(f"no package {digest}")
        return io.BytesIO(blob.data)

    def local_path(self, digest: str) -> Path | None:
        check_digest_syntax(digest)
        return None

    def url(self, digest: str, now: float | None = None) -> str:
        check_digest_syntax(digest)
        return self.urls.url(digest, now)

    def check_url(self, digest: str, expires: int, signature: str, now: float) -> None:
        self.urls.check(digest, expires, signature, now)

    def delete(self, digest: str) -> bool:
        check_digest_syntax(digest)
        with self._lock:
            return self._blobs.pop(digest, None) is not None

    def list(self) -> Iterator[StoredPackage]:
        with self._lock:
            blobs = list(self._blobs.items())
        for digest, blob in blobs:
            yield StoredPackage(digest, len(blob.data), blob.stored_at)

    def publish(self, digest: str, data: bytes) -> bool:
        """Store ``data`` unless ``digest`` already is; whether this call stored it. For
        ``MemoryUpload.commit``, which has checked that ``data`` hashes to ``digest``."""
        with self._lock:
            if digest in self._blobs:
                return False
            self._blobs[digest] = _Blob(data, self._clock())
            return True


class MemoryUpload(HashingUpload):
    """A ``PackageUpload`` into a buffer, published to the store's dict on commit."""

    def __init__(self, store: MemoryPackageStore, digest: str) -> None:
        super().__init__(digest)
        self._store = store
        self._buffer = io.BytesIO()

    def _append(self, chunk: bytes) -> None:
        self._buffer.write(chunk)

    def commit(self, check: Check | None = None) -> bool:
        self._check_hash()
        if self._store.exists(self.digest):
            return False
        data = self._buffer.getvalue()
        self._buffer.close()
        if check is not None:  # it reads a file: these bytes, staged for it alone
            with tempfile.NamedTemporaryFile(prefix="package-") as staged:
                staged.write(data)
                staged.flush()
                check(Path(staged.name))
        return self._store.publish(self.digest, data)

    def close(self) -> None:
        self._buffer.close()
