"""Fetch content-addressed blobs (packages, requirements files) into the pod's cache.

A blob is streamed to a temporary file while its sha256 is computed and its size capped; only
a blob whose digest matches is renamed to ``cache/blobs/<digest>``, so every file under that
name was verified (the rename is atomic). A later job with the same digest reads the cache and
fetches nothing. Nothing is extracted or installed from an unverified file.

The URL is the broker's signed ``/v1/blobs`` one or an object store's presigned GET (the s3
package store); either way the server checks it. Faults are typed and bounded: a refused URL
(tampered, expired: any 4xx) fails at once with ``PackageFetchFailed``; a server that is down
or answers 5xx is retried with backoff until the attempt's deadline, each try cut at what is
left of it, then fails ``PackageFetchFailed`` too; bytes that are not the package (wrong
digest, too large) are ``PackageRejected``. No fetch outlives its deadline.

With a ``fetch_socket`` (a sandboxed local pod, whose network namespace reaches neither the
broker's loopback URL nor, with ``network: none``, anything), every http(s) URL is fetched
through the broker's fetch socket instead (``GET /fetch?url=<url>`` over that unix socket:
``pool_manager.backends.package_proxy``), which GETs it from the host only if it is one of
the broker's package URLs and relays the answer; the same checks apply to what comes back.

Concurrency: one ``BlobCache`` per agent, used from the event loop; the agent runs one attempt
at a time, so two fetches of the same digest never race (and would be harmless if they did:
both write distinct temporary files and rename onto the same verified content).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import urllib.parse
from pathlib import Path

import aiohttp

from functions.errors import PackageFetchFailed, PackageRejected
from pod_runtime.protocol import BlobRef

CHUNK = 1 << 20
FETCH_TIMEOUT_S = 300.0
"""Longest one try of a fetch may take (less when the deadline is nearer)."""
FETCH_RETRY_S = 30.0
"""How long a fetch with no deadline of its own (a requirements file) retries a server that
is down before it fails ``PackageFetchFailed``."""
KEEP_BLOBS = 16
FETCH_SOCKET_URL = "http://firepool-fetch/fetch"
"""What the agent asks the fetch socket for (the host name is only the Host header)."""


def _sha256_of(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as src:
        while chunk := src.read(CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


class _Transient(Exception):
    """A fetch failure that may well succeed when tried again."""


async def _reason(resp: aiohttp.ClientResponse) -> str:
    """A refusal's reason, for the attempt's error: the API's error class or S3's error code
    and message (``: AccessDenied: Request has expired``), else nothing."""
    try:
        text = (await resp.content.read(4096)).decode(errors="replace")
    except (aiohttp.ClientError, TimeoutError):
        return ""
    found = [re.search(f"<{tag}>([^<]{{1,200}})</{tag}>", text) for tag in ("Code", "Message")]
    if any(found):
        return ": " + ": ".join(m.group(1) for m in found if m)
    match = re.search(r'"class"\s*:\s*"(\w{1,40})"', text)
    return f": {match.group(1)}" if match else ""


class BlobCache:
    """Verified blobs by digest under ``root``; evicts least recently used beyond ``keep``."""

    def __init__(
        self,
        root: Path,
        *,
        max_bytes: int,
        keep: int = KEEP_BLOBS,
        fetch_socket: Path | None = None,
    ) -> None:
        self.root = root
        self.fetch_socket = fetch_socket
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

    async def get(self, ref: BlobRef, deadline_s: float | None = None) -> tuple[Path, bool]:
        """Return (verified file, was_cached). ``deadline_s``: how long from now the fetch may
        take, retries included (the attempt's timeout; None: ``FETCH_RETRY_S``). Raises
        ``PackageFetchFailed`` when the bytes could not be fetched in time or the URL was
        refused, ``PackageRejected`` when they are not the package.

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
                digest = await self._download(ref.url, tmp, deadline_s or FETCH_RETRY_S)
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

    async def _download(self, url: str, tmp: Path, within_s: float) -> str:
        """Stream ``url`` to ``tmp``; return its sha256. A transport failure or a 5xx (the
        package server restarting, the object store down) is retried with backoff for
        ``within_s``, each try cut at what is left, then reported as ``PackageFetchFailed``
        (no user code ran); a refusal (4xx) is ``PackageFetchFailed`` at once, bytes that are
        too many ``PackageRejected``."""
        loop = asyncio.get_running_loop()
        delay = 0.05
        deadline = loop.time() + within_s
        tries = 0
        while True:
            tries += 1
            left = deadline - loop.time()
            try:
                return await self._download_once(url, tmp, min(FETCH_TIMEOUT_S, max(left, 0.01)))
            except _Transient as exc:
                if loop.time() + delay >= deadline:
                    raise PackageFetchFailed(
                        f"fetching the package failed {tries} times in {within_s:g} s (the "
                        f"attempt's deadline); last: {exc}"
                    ) from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def _download_once(self, url: str, tmp: Path, timeout_s: float) -> str:
        if self._session is None:
            connector = (
                aiohttp.UnixConnector(path=str(self.fetch_socket))
                if self.fetch_socket is not None
                else None
            )
            self._session = aiohttp.ClientSession(connector=connector)
        params: dict[str, str] | None = None
        if self.fetch_socket is not None:
            url, params = FETCH_SOCKET_URL, {"url": url}
        hasher = hashlib.sha256()
        size = 0
        try:
            timeout = aiohttp.ClientTimeout(total=timeout_s)
            async with self._session.get(url, params=params, timeout=timeout) as resp:
                if resp.status >= 500:
                    raise _Transient(f"HTTP {resp.status}")
                if resp.status != 200:
                    raise PackageFetchFailed(
                        f"the package server refused the URL: HTTP {resp.status}"
                        f"{await _reason(resp)}"
                    )
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
