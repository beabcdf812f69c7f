"""The broker's package fetch socket: how a local pod without the host's network gets its
package.

A sandboxed local pod lives in a network namespace of its own (``pod_runtime.network``): with
``network: none`` it reaches nothing, with ``outbound`` it reaches the world but never the
host's loopback, where the broker serves its signed ``/v1/blobs`` URLs (and where a
self-hosted object store often listens). So the local backend serves this one unix socket,
bound read-only into every sandbox, and the pod's agent fetches each http(s) package URL
through it (``GET /fetch?url=<url>``, ``pod_runtime.package``). The proxy GETs the URL from
the broker's host and relays status, length and body, but only a URL of the broker's
package store's own form: the scheme, host and port of the store's URLs and their path
around the digest, one sha256 in its place (``package_url_prefix``), query as given (the
signature, checked where the URL is served: the broker's ``/v1/blobs`` or the object store).
Anything else is refused with 403 and never requested. No redirect is followed. An
unreachable upstream answers 502, which the agent retries until its deadline.

The socket is ``0600`` in a ``0700`` directory owned by the broker's user: in a sandbox
started as root the agent (uid 0) reaches it and jobs (``nobody``) do not; where jobs keep the
agent's uid they could, and fetch only what a package URL they hold already allows.

Concurrency: runs on the broker's event loop; one upstream ``aiohttp`` session is shared.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web
from yarl import URL

PROBE_DIGEST = "0" * 64
DIGEST_RE = re.compile(r"[0-9a-f]{64}")
UPSTREAM_TIMEOUT_S = 300.0
CHUNK = 1 << 20
IDENTITY = {"Accept-Encoding": "identity"}
"""The bytes as stored: the proxy relays them undecoded and sends no ``Content-Encoding``."""


@dataclass(frozen=True, slots=True)
class UrlForm:
    """The store's package URLs: ``scheme://host:port`` + ``head`` + digest + ``tail`` (path)
    and any query (``/v1/blobs/`` + digest; S3's ``/<bucket>/<prefix>`` + digest + ``.zip``)."""

    origin: tuple[str, str | None, int | None]
    head: str
    tail: str


def package_url_prefix(package_url: Callable[[str], str]) -> UrlForm:
    """The form of the store's package URLs, found by asking it for one. ``ValueError`` if its
    URLs do not hold the digest in their path."""
    url = URL(package_url(PROBE_DIGEST))
    head, found, tail = url.raw_path.partition(PROBE_DIGEST)
    if not found:
        raise ValueError(f"package URLs of this store hold no digest in their path: {url}")
    return UrlForm((url.scheme, url.host, url.port), head, tail)


def allowed(url: str, forms: Sequence[UrlForm]) -> URL | None:
    """``url`` as a URL to request, if it has one of ``forms`` with exactly one sha256 digest
    in its place (any query); None otherwise."""
    try:
        parsed = URL(url, encoded=True)
    except (ValueError, TypeError):
        return None
    if parsed.user is not None or parsed.password is not None or parsed.fragment:
        return None
    path = parsed.raw_path
    for form in forms:
        if (parsed.scheme, parsed.host, parsed.port) != form.origin:
            continue
        digest = path[len(form.head) : len(path) - len(form.tail)]
        if (
            path.startswith(form.head)
            and path.endswith(form.tail)
            and len(path) == len(form.head) + 64 + len(form.tail)
            and DIGEST_RE.fullmatch(digest)
        ):
            return parsed
    return None


class PackageFetchProxy:
    """Serves ``GET /fetch?url=`` on the unix socket ``path`` for URLs of ``forms``."""

    def __init__(
        self, path: Path, forms: Sequence[UrlForm] | Callable[[], Sequence[UrlForm]]
    ) -> None:
        self.path = path
        self._forms = forms
        """The URL forms, or how to find them: asked once, at ``start`` (a store that signs
        its URLs, S3, may not be able to sign one before the broker runs)."""
        self.forms: tuple[UrlForm, ...] = ()
        self.bytes_relayed = 0
        """Package bytes relayed to pods so far, the bodies of 200 answers (a metric: the
        broker's host on the data path)."""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def started(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        """Listen (replacing a socket an earlier broker left: pods bind its directory, so they
        see the new one)."""
        if self._runner is not None:
            return
        self.forms = tuple(self._forms() if callable(self._forms) else self._forms)
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path.parent, 0o700)
        self.path.unlink(missing_ok=True)
        app = web.Application()
        app.router.add_get("/fetch", self._fetch)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.UnixSite(runner, str(self.path)).start()
        os.chmod(self.path, 0o600)
        self._runner = runner

    async def _fetch(self, request: web.Request) -> web.StreamResponse:
        target = allowed(request.query.get("url", ""), self.forms)
        if target is None:
            return web.json_response(
                {"class": "Forbidden", "message": "not a package URL of this broker's store"},
                status=403,
            )
        if self._session is None:
            self._session = aiohttp.ClientSession(auto_decompress=False)
        resp: web.StreamResponse | None = None
        try:
            timeout = aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_S)
            async with self._session.get(
                target, allow_redirects=False, timeout=timeout, headers=IDENTITY
            ) as up:
                resp = web.StreamResponse(status=up.status)
                if up.content_length is not None:
                    resp.content_length = up.content_length
                resp.content_type = up.content_type
                await resp.prepare(request)
                package = up.status == 200  # not an error's body
                async for chunk in up.content.iter_chunked(CHUNK):
                    await resp.write(chunk)
                    if package:
                        self.bytes_relayed += len(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
            if resp is not None:  # already answering: cut it short (the agent retries)
                raise
            return web.json_response(
                {"class": "BadGateway", "message": f"package server unreachable: {exc!r}"},
                status=502,
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(OSError):
            self.path.unlink()
