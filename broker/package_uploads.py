"""Package uploads the broker authorises without carrying their bytes (paper §4, App. A.2).

``POST /v1/packages/{sha256}/uploads`` asks to upload ``size`` bytes of a package. The answer
(``Authorised``) is one of:

- ``transfer: none``: this caller already uploaded these bytes; nothing to send;
- ``transfer: broker``: the store is the broker's own (local, memory): send them through
  ``PUT /v1/packages/{sha256}`` as before;
- ``transfer: s3``: presigned PUTs straight into the bucket's staging area
  (``functions.stores.s3_uploads``) and a ``ticket``; ``POST .../uploads:complete`` with the
  ticket (and each part's ETag) then has the broker verify the staged object's SHA-256, copy
  it into place, and only then record the caller as an uploader.

A ticket is the upload's whole state, HMAC-signed by the broker: digest, size, caller,
staging key, multipart upload id and expiry. No table of uploads in progress is kept, so a
restarted broker (or another one sharing the key and bucket) completes what this one began,
and a ticket cannot be bent to another digest, size, caller or key, nor used after it
expires. Blocking: ``begin`` and ``finish`` make network calls (call them from a thread).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass, field
from typing import Any

import orjson

from functions.errors import Expired, Forbidden, InvalidRequest
from functions.stores import PackageStore, S3PackageStore
from functions.stores.s3_uploads import DirectUploads, PartUrl

COMPLETE_WINDOW_S = 3600
"""How long after its URLs expire an upload may still be completed: a PUT begun before its
URL expired may run on (a 512 MiB package over a slow link)."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """One authorised direct upload, as its signed ticket carries it."""

    digest: str
    size: int
    caller: str
    key: str
    upload_id: str | None
    expires: int


class Tickets:
    """Signs and checks ``Ticket``s: ``<base64url(json)>.<hex HMAC-SHA256>``."""

    def __init__(self, key: bytes) -> None:
        self._key = hashlib.sha256(b"upload-ticket|" + key).digest()

    def _sign(self, body: bytes) -> str:
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()

    def issue(self, ticket: Ticket) -> str:
        payload = {
            "d": ticket.digest, "n": ticket.size, "c": ticket.caller, "k": ticket.key,
            "u": ticket.upload_id, "e": ticket.expires,
        }  # fmt: skip
        body = base64.urlsafe_b64encode(orjson.dumps(payload))
        return f"{body.decode()}.{self._sign(body)}"

    def read(self, text: str, now: float) -> Ticket:
        """The ticket ``text`` carries: ``Forbidden`` unless this broker signed it,
        ``Expired`` once past its expiry."""
        body, _, signature = text.encode().partition(b".")
        if not hmac.compare_digest(self._sign(body), signature.decode(errors="replace")):
            raise Forbidden("this upload ticket was not issued by this broker", field="ticket")
        fields = orjson.loads(base64.urlsafe_b64decode(body))
        ticket = Ticket(
            fields["d"], fields["n"], fields["c"], fields["k"], fields["u"], fields["e"]
        )
        if now > ticket.expires:
            raise Expired("the upload ticket expired: ask for the upload again", field="ticket")
        return ticket


@dataclass(frozen=True, slots=True)
class Authorised:
    """The answer to an upload request (the module docstring lists the three kinds)."""

    digest: str
    size: int
    transfer: str
    parts: list[PartUrl] = field(default_factory=list)
    ticket: str | None = None
    expires: int | None = None

    @property
    def upload_bytes(self) -> int:
        """What the client is to send (0: nothing)."""
        return 0 if self.transfer == "none" else self.size

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "digest": self.digest, "size": self.size, "stored": self.transfer == "none",
            "transfer": self.transfer, "upload_bytes": self.upload_bytes,
        }  # fmt: skip
        if self.transfer == "s3":
            body |= {
                "ticket": self.ticket, "expires": self.expires,
                "parts": [p.to_json() for p in self.parts],
            }  # fmt: skip
        return body


class PackageUploads:
    """Direct uploads into ``packages`` when it is an S3 store (``direct``), else none."""

    def __init__(self, packages: PackageStore, key: bytes) -> None:
        self.direct = DirectUploads(packages) if isinstance(packages, S3PackageStore) else None
        self.tickets = Tickets(key)
        self.ttl_s = packages.config.url_ttl_s if isinstance(packages, S3PackageStore) else 0

    def begin(self, digest: str, size: int, caller: str, now: float) -> Authorised:
        """Presign the upload of ``size`` bytes of ``digest`` for ``caller`` (an S3 store),
        or say it goes through the broker (any other)."""
        if self.direct is None:
            return Authorised(digest, size, "broker")
        expires = int(now + self.ttl_s + COMPLETE_WINDOW_S)
        staged = self.direct.begin(digest, size, secrets.token_hex(12))
        ticket = Ticket(digest, size, caller, staged.key, staged.upload_id, expires)
        issued = self.tickets.issue(ticket)
        return Authorised(digest, size, "s3", staged.parts, issued, expires)

    def check(self, text: str, digest: str, caller: str, now: float) -> Ticket:
        """The ticket ``text``, which must be ``caller``'s for ``digest`` and unexpired."""
        ticket = self.tickets.read(text, now)
        if ticket.digest != digest or ticket.caller != caller:
            raise Forbidden("this upload ticket is for another package or caller", field="ticket")
        return ticket

    def finish(self, ticket: Ticket, etags: list[str]) -> bool:
        """Verify the staged upload and copy it into place; whether that created the
        package (``DirectUploads.finish``)."""
        if self.direct is None:
            raise InvalidRequest("this broker's store takes uploads through the broker")
        if ticket.upload_id is not None and not etags:
            raise InvalidRequest(
                "a multipart upload completes with its parts' ETags", field="etags"
            )
        return self.direct.finish(ticket.digest, ticket.size, ticket.key, ticket.upload_id, etags)
