"""The client side of a package upload (``broker.package_uploads``): ask, then send what the
broker says, where it says.

``send_package`` asks ``POST /v1/packages/{sha256}/uploads`` and then sends nothing (this
caller already uploaded these bytes), the bytes through the broker (``PUT
/v1/packages/{sha256}``: its own local or memory store), or each part to its presigned URL
in the object store followed by ``POST .../uploads:complete``. The bearer token goes to the
broker only, never to the object store: the presigned URL is the credential there.

Memory: one chunk at a time whatever the package's size; each part is streamed from the
file with its Content-Length. Blocking (httpx's sync client); one upload per call.
"""

from __future__ import annotations

import contextlib
import io
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, NoReturn

import httpx

from functions.errors import PackageRejected, StoreUnavailable
from functions.packaging import CHUNK

_JSON = "application/json"
Refuse = Callable[[httpx.Response], NoReturn]
"""Raises the typed error of a broker's error answer (``Client._raise``)."""


@dataclass(frozen=True, slots=True)
class Sent:
    """What one ``send_package`` did."""

    digest: str
    size: int
    bytes_sent: int
    """Package bytes this call sent anywhere (0: the caller had uploaded them before)."""
    transfer: str
    """``none``, ``broker`` or ``s3`` (the broker's answer)."""
    created: bool
    """Whether the bytes were new to the store (False also when nothing was sent)."""


Progress = Callable[[int], None]
"""Told the bytes of each chunk once it is handed to the connection (a progress bar)."""


def _chunks(
    file: BinaryIO, offset: int, size: int, progress: Progress | None = None
) -> Iterator[bytes]:
    """``size`` bytes of ``file`` from ``offset``, a chunk at a time."""
    file.seek(offset)
    left = size
    while left > 0:
        chunk = file.read(min(CHUNK, left))
        if not chunk:
            raise PackageRejected(f"the package file ended {left} bytes early")
        left -= len(chunk)
        yield chunk
        if progress is not None:
            progress(len(chunk))


def send_package(
    http: httpx.Client,
    refuse: Refuse,
    digest: str,
    size: int,
    source: bytes | BinaryIO,
    content_type: str = "application/zip",
    progress: Progress | None = None,
) -> Sent:
    """Upload ``size`` bytes hashing to ``digest`` from ``source`` as the broker directs
    (``http``: a client of the broker, with the caller's token). A broker's refusal raises
    through ``refuse``; an object store that cannot be reached or answers 5xx or 403 raises
    ``StoreUnavailable``, one that refuses the bytes (they do not hash to ``digest``)
    ``PackageRejected``. ``progress`` is told each chunk sent."""
    path = f"/v1/packages/{urllib.parse.quote(digest, safe='')}"
    answer = _call(http, refuse, "POST", f"{path}/uploads", "transfer", json={"size": size})
    transfer = str(answer["transfer"])
    if transfer == "none":
        return Sent(digest, size, 0, transfer, False)
    file = io.BytesIO(source) if isinstance(source, bytes) else source
    if transfer == "broker":
        headers = {"Content-Type": content_type, "Content-Length": str(size)}
        content = _chunks(file, 0, size, progress)
        stored = _call(http, refuse, "PUT", path, "created", content=content, headers=headers)
        return Sent(digest, size, size, transfer, bool(stored["created"]))
    if transfer != "s3":
        raise StoreUnavailable(f"the broker answered an unknown transfer {transfer!r}")
    parts = answer["parts"]
    with httpx.Client(timeout=http.timeout) as direct:  # no bearer token: never to the store
        etags = [_put_part(direct, file, part, progress) for part in parts]
    body = {"ticket": answer["ticket"], "etags": etags if len(parts) > 1 else []}
    stored = _call(http, refuse, "POST", f"{path}/uploads:complete", "created", json=body)
    return Sent(digest, size, size, transfer, bool(stored["created"]))


def _call(
    http: httpx.Client, refuse: Refuse, method: str, url: str, key: str, **kwargs: Any
) -> dict[str, Any]:
    """The broker's JSON answer, which has ``key``; anything else (an error, a page from a
    wrong URL, another service's JSON) goes to ``refuse``."""
    resp = http.request(method, url, **kwargs)
    body = None
    if resp.status_code < 400 and resp.headers.get("content-type", "").startswith(_JSON):
        with contextlib.suppress(ValueError):
            body = resp.json()
    if not isinstance(body, dict) or key not in body:
        refuse(resp)
    return body


def _put_part(
    direct: httpx.Client, file: BinaryIO, part: dict[str, Any], progress: Progress | None = None
) -> str:
    """PUT one part to its presigned URL; its ETag."""
    size = int(part["size"])
    headers = {**part.get("headers", {}), "Content-Length": str(size)}
    try:
        resp = direct.put(
            part["url"], content=_chunks(file, int(part["offset"]), size, progress), headers=headers
        )
    except httpx.TransportError as exc:
        raise StoreUnavailable(f"the object store is unreachable: {exc!r}") from exc
    if resp.status_code == 400 and b"BadDigest" in resp.content:
        raise PackageRejected("the object store refused the bytes: they do not hash to the digest")
    if resp.status_code >= 300:
        raise StoreUnavailable(
            f"the object store refused part {part['number']} of the upload: HTTP {resp.status_code}"
        )
    return resp.headers.get("etag", "")
