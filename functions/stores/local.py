"""``LocalPackageStore``: packages as files in a directory of the broker's host, the default.

Layout: ``root/<first two hex digits>/<digest>``, with uploads in progress in
``root/.uploads``. An upload is written to a staging file, fsynced, checked, then hard-linked
into place: a link fails if the target exists, so of concurrent writers of one digest exactly
one is told it stored the package, and a reader sees either no file or the whole one. One
broker per state directory (``broker.exclusive``), so what a stopped broker left in staging is
removed when the store opens. Pods fetch through ``BlobUrls`` served by the broker.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from functions.errors import NotFound
from functions.spec import DIGEST_RE
from functions.stores.base import Check, HashingUpload, StoredPackage, check_digest_syntax
from functions.stores.signed_urls import BlobUrls, UrlSigner


class LocalPackageStore:
    """A ``PackageStore`` over ``root`` (created if missing)."""

    def __init__(self, root: Path, signer: UrlSigner, base_url: str, ttl_s: int = 900) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self.staging = root / ".uploads"
        """Uploads in progress; what a stopped broker left there is removed here."""
        self.staging.mkdir(exist_ok=True)
        for stale in self.staging.iterdir():
            stale.unlink(missing_ok=True)
        self.urls = BlobUrls(signer, base_url, ttl_s)

    def path(self, digest: str) -> Path:
        """Where ``digest`` lives, stored or not."""
        check_digest_syntax(digest)
        return self.root / digest[:2] / digest

    def upload(self, digest: str) -> LocalUpload:
        check_digest_syntax(digest)
        fd, tmp = tempfile.mkstemp(dir=self.staging, prefix="upload-")
        return LocalUpload(self.path(digest), fd, Path(tmp))

    def exists(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def open(self, digest: str) -> BinaryIO:
        try:
            return self.path(digest).open("rb")
        except FileNotFoundError:
            raise NotFound(f"no package {digest}") from None

    def local_path(self, digest: str) -> Path | None:
        path = self.path(digest)
        return path if path.is_file() else None

    def url(self, digest: str, now: float | None = None) -> str:
        check_digest_syntax(digest)
        return self.urls.url(digest, now)

    def check_url(self, digest: str, expires: int, signature: str, now: float) -> None:
        self.urls.check(digest, expires, signature, now)

    def delete(self, digest: str) -> bool:
        try:
            self.path(digest).unlink()
        except FileNotFoundError:
            return False
        return True

    def list(self) -> Iterator[StoredPackage]:
        for shard in self.root.iterdir():
            if len(shard.name) != 2 or not shard.is_dir():
                continue  # the staging directory
            for entry in shard.iterdir():
                if not DIGEST_RE.fullmatch(entry.name):
                    continue
                try:
                    stat = entry.stat()
                except FileNotFoundError:
                    continue  # deleted during the walk
                yield StoredPackage(entry.name, stat.st_size, stat.st_mtime)


class LocalUpload(HashingUpload):
    """A ``PackageUpload`` into a staging file, linked to ``target`` on commit."""

    def __init__(self, target: Path, fd: int, tmp: Path) -> None:
        super().__init__(target.name)
        self._target = target
        self._file = os.fdopen(fd, "wb")
        self._tmp = tmp

    def _append(self, chunk: bytes) -> None:
        self._file.write(chunk)

    def commit(self, check: Check | None = None) -> bool:
        self._check_hash()
        if self._target.is_file():
            return False
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        if check is not None:
            check(self._tmp)
        self._target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(self._tmp, self._target)
        except FileExistsError:
            return False
        return True

    def close(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)
