"""Package URLs the broker serves itself: ``GET <base>/v1/blobs/<digest>?exp=<unix>&sig=<hmac>``.

The local and memory stores hand pods these (the local analogue of S3 presigned URLs): the
signature covers the digest and the expiry, so the URL is the pod's only credential and
cannot be bent to another package or a later time. The gateway's blob route checks them
through ``PackageStore.check_url`` and reads the bytes through the store.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from urllib.parse import urlencode

from functions.errors import Expired, Forbidden


class UrlSigner:
    """HMAC-SHA256 signatures over ``digest|expiry``; constant-time verification."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def sign(self, digest: str, expires: int) -> str:
        msg = f"{digest}|{expires}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def verify(self, digest: str, expires: int, signature: str, now: float) -> None:
        """``Forbidden`` for a signature this key did not make over ``(digest, expires)``,
        then ``Expired`` once ``now`` is past ``expires``. Compared as UTF-8 bytes: a query
        string may carry any text, and ``compare_digest`` refuses non-ASCII ``str``."""
        expected = self.sign(digest, expires).encode()
        if not hmac.compare_digest(expected, signature.encode("utf-8", "surrogatepass")):
            raise Forbidden("bad package URL signature")
        if now > expires:
            raise Expired("package URL expired")


class BlobUrls:
    """Signed ``/v1/blobs`` URLs below ``base_url`` (what pods reach the broker at), each
    valid for ``ttl_s`` seconds from when it is made."""

    def __init__(self, signer: UrlSigner, base_url: str, ttl_s: int = 900) -> None:
        self.signer = signer
        self.base_url = base_url.rstrip("/")
        self.ttl_s = ttl_s

    def url(self, digest: str, now: float | None = None) -> str:
        expires = int((time.time() if now is None else now) + self.ttl_s)
        query = urlencode({"exp": expires, "sig": self.signer.sign(digest, expires)})
        return f"{self.base_url}/v1/blobs/{digest}?{query}"

    def check(self, digest: str, expires: int, signature: str, now: float) -> None:
        self.signer.verify(digest, expires, signature, now)
