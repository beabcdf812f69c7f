"""The package-store seam: what every store of packages guarantees (``PackageStore``).

A package (a code zip or a requirements file) is stored once under the SHA-256 digest of its
bytes. Nothing becomes visible before its bytes are known to hash to that digest, so a reader
never sees a half-written or mismatching package, and storing the same bytes again changes
nothing. Pods never read a store directly: the broker hands each one a signed URL that expires.

Who uploaded a digest is not the store's to keep. Those records are per-caller rows in the job
store (``JobStore.put_package`` after a commit, ``JobStore.uploaded_by`` before a function may
name the digest): a deployer may only build on bytes it sent, an existence check must not tell
other callers what is stored, and an object store (S3) holds objects, not per-caller rows that
change in one transaction with the functions that reference them. A store knows digests, sizes
and when they were stored (``list``); collection joins that with the job store's references.

Blocking: ``upload``, ``write``, ``url``, ``check_url`` and ``local_path`` do no network I/O
and may be called on the event loop (the local store's touch its disk briefly). ``commit``,
``exists``, ``open``, ``delete`` and ``list`` may wait on a disk or a network: async code calls
them from a worker thread (``asyncio.to_thread``).

An S3 store fits the same seam: ``url`` presigns a GET, ``check_url`` refuses every URL (the
broker serves no bytes of it), ``local_path`` is None, ``commit`` writes under the digest's key
only once the SHA-256 checks out. An upload straight from a client to the object store
(a presigned PUT) is that store's addition; the broker then records the uploader only once
``exists`` (a verified object) is true.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol, Self

from functions.errors import InvalidRequest, PackageRejected
from functions.packaging import MAX_PACKAGE_BYTES
from functions.spec import DIGEST_RE

Check = Callable[[Path], None]
"""Looks at a package's bytes in a local file before they are stored, and raises (typically
``PackageRejected``) to refuse them; ``broker.package_check.check_package_file`` is one."""


def check_digest_syntax(digest: str) -> None:
    """``InvalidRequest`` (field ``sha256``) unless ``digest`` is 64 lowercase hex digits."""
    if not DIGEST_RE.fullmatch(digest):
        raise InvalidRequest("a package digest is 64 lowercase hex digits", field="sha256")


@dataclass(frozen=True, slots=True)
class StoredPackage:
    """One package a store holds, as ``PackageStore.list`` reports it."""

    digest: str
    size: int
    """Bytes."""
    stored_at: float
    """Unix time its bytes were first stored (a later put of the same bytes leaves it)."""


class PackageUpload(Protocol):
    """One package being received for ``digest``: ``write`` its bytes in chunks, then
    ``commit``. Used as a context manager: leaving the block discards whatever was not
    committed, whatever happened. One writer; not thread-safe.

    Memory stays about one chunk whatever the package's size (the local store writes each chunk
    to a staging file): a whole body held in memory would cost its size again per upload."""

    @property
    def digest(self) -> str:
        """The digest the bytes must hash to (checked by ``PackageStore.upload``)."""
        ...

    @property
    def size(self) -> int:
        """Bytes written so far."""
        ...

    def write(self, chunk: bytes) -> None:
        """Append ``chunk``, hashing it; ``PackageRejected`` once the package passes
        ``MAX_PACKAGE_BYTES``."""
        ...

    def commit(self, check: Check | None = None) -> bool:
        """Store the bytes written under ``digest`` and return whether this call stored them
        (False: they were already there, put by anyone). ``PackageRejected`` when they hash
        to another digest; ``check`` runs on a local file holding exactly these bytes before
        they become visible, and what it raises propagates. On any error nothing is stored.
        Of concurrent commits of one digest exactly one returns True, and readers only ever
        see the whole package. Called once; blocks (a disk, a network)."""
        ...

    def close(self) -> None:
        """Discard what was not committed (a staging file, buffered bytes); idempotent."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...


class PackageStore(Protocol):
    """Packages by digest. Every method taking a digest refuses a malformed one with
    ``InvalidRequest`` (field ``sha256``) before touching anything."""

    def upload(self, digest: str) -> PackageUpload:
        """A streamed put of the package ``digest`` (``PackageUpload``)."""
        ...

    def exists(self, digest: str) -> bool:
        """Whether the package is stored: committed and not deleted since."""
        ...

    def open(self, digest: str) -> BinaryIO:
        """The stored bytes, as a readable, seekable binary file the caller closes;
        ``NotFound`` when the package is not stored."""
        ...

    def local_path(self, digest: str) -> Path | None:
        """The file on this host that holds the package, for readers that want a path
        (``mmap``, ``sendfile``); None when the store keeps no such file or the package is not
        stored (``open`` then reads it). Read-only, valid until the package is deleted."""
        ...

    def url(self, digest: str, now: float | None = None) -> str:
        """A URL a pod GETs the package from until ``now + ttl`` (``now``: the current time
        when None). It is signed: a URL with any part changed, or past its expiry, is refused
        wherever it is served. Whether the package is stored is not checked here; a fetch of
        one that is not answers 404."""
        ...

    def check_url(self, digest: str, expires: int, signature: str, now: float) -> None:
        """For a URL the broker serves itself (``GET /v1/blobs/{digest}?exp=&sig=``):
        ``Forbidden`` unless this store signed ``(digest, expires)`` as ``signature``,
        ``Expired`` once ``now`` is past ``expires``. A store whose URLs point elsewhere (S3)
        refuses every one with ``Forbidden``."""
        ...

    def delete(self, digest: str) -> bool:
        """Remove the package; return whether it was stored. A reader that already opened it
        may finish. Collection must only delete digests that no function version references
        and no upload is writing: a commit racing a delete may be told the bytes are stored."""
        ...

    def list(self) -> Iterator[StoredPackage]:
        """Every stored package (digest, size, when stored), in no particular order; one
        committed or deleted during the walk may or may not appear."""
        ...


class HashingUpload(abc.ABC):
    """What every ``PackageUpload`` shares: the size cap, the running SHA-256, the digest check
    and the context manager. A store subclasses it with ``_append``, ``commit`` and ``close``."""

    def __init__(self, digest: str) -> None:
        check_digest_syntax(digest)
        self._digest = digest
        self._size = 0
        self._hash = hashlib.sha256()

    @property
    def digest(self) -> str:
        return self._digest

    @property
    def size(self) -> int:
        return self._size

    def write(self, chunk: bytes) -> None:
        self._size += len(chunk)
        if self._size > MAX_PACKAGE_BYTES:
            raise PackageRejected(f"package is over {MAX_PACKAGE_BYTES} bytes (the cap)")
        self._hash.update(chunk)
        self._append(chunk)

    @abc.abstractmethod
    def _append(self, chunk: bytes) -> None:
        """Keep ``chunk``, the next bytes of the package (size and hash already counted)."""

    def _check_hash(self) -> None:
        """``PackageRejected`` unless the bytes written hash to ``digest``."""
        actual = self._hash.hexdigest()
        if actual != self._digest:
            raise PackageRejected(f"body sha256 is {actual}, not {self._digest}")

    @abc.abstractmethod
    def commit(self, check: Check | None = None) -> bool:
        """Store the bytes under the digest (``PackageUpload.commit``)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop what an upload that was not committed kept (``PackageUpload.close``)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@contextlib.contextmanager
def local_file(store: PackageStore, digest: str) -> Iterator[Path]:
    """A path holding the stored package: the store's own file where it keeps one, else a
    temporary copy (read through ``open``) removed on exit. ``NotFound`` when not stored.
    Blocks: call it from a worker thread in async code."""
    path = store.local_path(digest)
    if path is not None:
        yield path
        return
    with store.open(digest) as blob, tempfile.NamedTemporaryFile(prefix="package-") as copy:
        shutil.copyfileobj(blob, copy)
        copy.flush()
        yield Path(copy.name)
