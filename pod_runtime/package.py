"""Fetch content-addressed blobs (packages, requirements files) into the pod's cache.

A blob is streamed to a temporary file while its sha256 is computed and its size capped; only
a blob whose digest matches is renamed to ``cache/blobs/<digest>``, so every file under that
name was verified (the rename is atomic). A later job with the same digest reads the cache and
fetches nothing. Nothing is extracted or installed from an unverified file.

Concurrency: one ``BlobCache`` per agent, used from the event loop; the agent runs one attempt
at a time, so two fetches of the same digest never race (and would be harmless if they did:
both write distinct temporary files and rename onto the same verified content).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import urllib.parse
from pathlib import Path

import aiohttp

from functions.errors import PackageRejected, Unavailable
from pod_runtime.protocol import BlobRef

CHUNK = 1 << 20
FETCH_TIMEOUT_S = 300.0
FETCH_RETRY_S = 30.0
"""How long transport failures are retried before the attempt fails as ``Unavailable``."""
KEEP_BLOBS = 16


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


class _Transient(Exception):
    """A fetch failure that may well succeed when tried again."""


class BlobCache:
    """Verified blobs by digest under ``root``; evicts least recently used beyond ``keep``."""

    def __init__(self, root: Path, *, max_bytes: int, keep: int = KEEP_BLOBS) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.keep = keep
        self.root.mkdir(parents=True, exist_ok=True)
        self._session: aiohttp.ClientSession | None = None
        self._verified: dict[str, tuple[int, int, int]] = {}

    def path(self, digest: str) -> Path:
        return self.root / digest

    def _remember(self, digest: str, target: Path) -> None:
        """Record the verified file's identity; a job (same uid, same tree) could rewrite it,
        but not without changing its ctime, which no unprivileged call can set back."""
        with contextlib.suppress(OSError):
            os.utime(target)  # recency for eviction (changes ctime: record after it)
            st = target.stat()
            self._verified[digest] = (st.st_ino, st.st_size, st.st_ctime_ns)

    def _unchanged(self, digest: str, target: Path) -> bool:
        try:
            st = target.stat()
        except OSError:
            return False
        return self._verified.get(digest) == (st.st_ino, st.st_size, st.st_ctime_ns)

    async def get(self, ref: BlobRef) -> tuple[Path, bool]:
        """Return (verified file, was_cached). Raises ``PackageRejected`` on any failure.

        A cached file is trusted only if it is the very file this agent verified (same
        inode, size and ctime); otherwise (changed, or cached by an earlier agent) it is
        hashed again and, if it no longer matches, fetched afresh."""
        target = self.path(ref.digest)
        if target.exists():
            if (
                not self._unchanged(ref.digest, target)
                and await asyncio.to_thread(_sha256_of, target) != ref.digest
            ):
                target.unlink(missing_ok=True)
                self._verified.pop(ref.digest, None)
            if target.exists():
                self._remember(ref.digest, target)
                return target, True
        tmp = self.root / f".{ref.digest}.{os.getpid()}.partial"
        try:
            scheme = urllib.parse.urlsplit(ref.url).scheme
            if scheme == "file":
                digest = await asyncio.to_thread(self._copy_file, ref.url, tmp)
            elif scheme in ("http", "https"):
                digest = await self._download(ref.url, tmp)
            else:
                raise PackageRejected(f"unsupported package URL scheme {scheme!r}")
            if digest != ref.digest:
                raise PackageRejected(
                    f"digest mismatch: expected {ref.digest}, fetched content is {digest}"
                )
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        self._remember(ref.digest, target)
        self._evict()
        return target, False

    def _copy_file(self, url: str, tmp: Path) -> str:
        path = urllib.parse.unquote(urllib.parse.urlsplit(url).path)
        hasher = hashlib.sha256()
        size = 0
        try:
            with open(path, "rb") as src, open(tmp, "wb") as out:
                while chunk := src.read(CHUNK):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise PackageRejected(f"package exceeds {self.max_bytes} bytes")
                    hasher.update(chunk)
                    out.write(chunk)
        except OSError as exc:
            raise PackageRejected(f"cannot read {url}: {exc.strerror}") from exc
        return hasher.hexdigest()

    async def _download(self, url: str, tmp: Path) -> str:
        """Stream ``url`` to ``tmp``; return its sha256. A transport failure or a 5xx (the
        package server restarting, say) is retried with backoff for ``FETCH_RETRY_S`` and then
        reported as ``Unavailable`` (retryable: no user code ran); an answer that can never
        succeed (4xx, too large) is ``PackageRejected`` at once."""
        delay = 0.05
        deadline = asyncio.get_running_loop().time() + FETCH_RETRY_S
        while True:
            try:
                return await self._download_once(url, tmp)
            except _Transient as exc:
                if asyncio.get_running_loop().time() + delay > deadline:
                    raise Unavailable(f"fetching the package failed: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _download_once(self, url: str, tmp: Path) -> str:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FETCH_TIMEOUT_S)
            )
        hasher = hashlib.sha256()
        size = 0
        try:
            async with self._session.get(url) as resp:
                if resp.status >= 500:
                    raise _Transient(f"HTTP {resp.status}")
                if resp.status != 200:
                    raise PackageRejected(f"fetching the package answered HTTP {resp.status}")
                if (resp.content_length or 0) > self.max_bytes:
                    raise PackageRejected(f"package exceeds {self.max_bytes} bytes")
                with open(tmp, "wb") as out:
                    async for chunk in resp.content.iter_chunked(CHUNK):
                        size += len(chunk)
                        if size > self.max_bytes:
                            raise PackageRejected(f"package exceeds {self.max_bytes} bytes")
                        hasher.update(chunk)
                        out.write(chunk)
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            raise _Transient(repr(exc)) from exc
        return hasher.hexdigest()

    def _evict(self) -> None:
        blobs = [p for p in self.root.iterdir() if not p.name.startswith(".")]
        if len(blobs) <= self.keep:
            return
        blobs.sort(key=lambda p: p.stat().st_mtime)
        for old in blobs[: len(blobs) - self.keep]:
            old.unlink(missing_ok=True)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
