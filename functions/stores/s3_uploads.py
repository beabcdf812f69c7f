"""Uploads straight from a client to the bucket: presigned PUTs, verified before they count.

``begin`` picks a staging key (``<prefix>uploads/<sha256>/<token>``) and presigns what the
client sends there: one PUT carrying ``x-amz-checksum-sha256`` (the server refuses bytes that
hash to anything else), or, for a package over ``S3Config.part_bytes``, a multipart upload
with one presigned PUT per part. ``finish`` completes a multipart upload, then verifies the
staged object: its stored full-object SHA-256 where the server kept one, else by reading it
back and hashing it (a multipart object's checksum is one of its parts' checksums, never the
whole object's). Only verified bytes are copied (server-side) to the package's key, and the
staging object is removed either way. So a client can never place bytes under a digest they
do not hash to, even on a server that ignores checksum headers.

What is staged and never finished (a client that gave up) stays under ``uploads/``;
collection removes it once its ticket has expired. Blocking: network calls throughout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from functions.errors import InvalidRequest, PackageRejected
from functions.stores.s3 import (
    MIN_PART_BYTES,
    S3PackageStore,
    checksum_b64,
    error_code,
    store_error,
)

MAX_PARTS = 10_000
"""S3's most parts in one multipart upload."""


@dataclass(frozen=True, slots=True)
class PartUrl:
    """One PUT a client makes: ``size`` bytes of the package from ``offset`` to ``url``, with
    ``headers`` (signed into the URL: sent exactly)."""

    number: int
    url: str
    offset: int
    size: int
    headers: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number, "url": self.url, "offset": self.offset, "size": self.size,
            "headers": self.headers,
        }  # fmt: skip


@dataclass(frozen=True, slots=True)
class StagedUpload:
    """What ``finish`` needs back: where the bytes were staged, and the multipart upload id
    (None for a single PUT)."""

    key: str
    upload_id: str | None
    parts: list[PartUrl]


def part_plan(size: int, part_bytes: int) -> list[tuple[int, int]]:
    """``(offset, size)`` of each part of a ``size``-byte upload: one part up to
    ``part_bytes``, else parts of ``part_bytes`` (at least S3's 5 MiB) and a shorter last one."""
    part = max(part_bytes, MIN_PART_BYTES)
    if size <= part_bytes:
        return [(0, size)]
    part = max(part, -(-size // MAX_PARTS))
    return [(offset, min(part, size - offset)) for offset in range(0, size, part)]


class DirectUploads:
    """Presigned uploads into ``store``'s bucket (``begin``) and their verification
    (``finish``). Stateless: what ``begin`` returns travels in the broker's upload ticket."""

    def __init__(self, store: S3PackageStore) -> None:
        self.store = store
        self.client = store.client
        self.bucket = store.bucket

    def staging_key(self, digest: str, token: str) -> str:
        self.store.key(digest)  # checks the digest's syntax
        if not token.isalnum():
            raise InvalidRequest("bad upload token", field="ticket")
        return f"{self.store.config.prefix}uploads/{digest}/{token}"

    def begin(self, digest: str, size: int, token: str) -> StagedUpload:
        """Presign the PUTs of a ``size``-byte package ``digest`` to a fresh staging key."""
        key = self.staging_key(digest, token)
        ttl = self.store.config.url_ttl_s
        plan = part_plan(size, self.store.config.part_bytes)
        try:
            if len(plan) == 1:
                checksum = checksum_b64(digest)
                url = self.client.generate_presigned_url(
                    "put_object",
                    Params={"Bucket": self.bucket, "Key": key, "ChecksumSHA256": checksum},
                    ExpiresIn=ttl,
                )
                part = PartUrl(1, url, 0, size, {"x-amz-checksum-sha256": checksum})
                return StagedUpload(key, None, [part])
            started = self.client.create_multipart_upload(Bucket=self.bucket, Key=key)
        except (ClientError, BotoCoreError) as exc:
            raise store_error(exc, f"an upload of {digest}") from exc
        upload_id = str(started["UploadId"])
        parts = [
            PartUrl(n, self._part_url(key, upload_id, n), offset, length)
            for n, (offset, length) in enumerate(plan, start=1)
        ]
        return StagedUpload(key, upload_id, parts)

    def _part_url(self, key: str, upload_id: str, number: int) -> str:
        params = {"Bucket": self.bucket, "Key": key, "UploadId": upload_id, "PartNumber": number}
        ttl = self.store.config.url_ttl_s
        return str(self.client.generate_presigned_url("upload_part", Params=params, ExpiresIn=ttl))

    def finish(
        self, digest: str, size: int, key: str, upload_id: str | None, etags: list[str]
    ) -> bool:
        """Complete (multipart), verify the staged object is ``size`` bytes hashing to
        ``digest``, and copy it to the package's key; whether this call created that.
        ``PackageRejected`` when the staged bytes are missing or do not check out (nothing
        is stored then); the staging object is removed either way."""
        try:
            if upload_id is not None:
                self._complete(key, upload_id, etags)
            self._verify(digest, size, key)
            return self.store.copy_into_place(key, digest)
        finally:
            self.store.delete_key(key)

    def _complete(self, key: str, upload_id: str, etags: list[str]) -> None:
        parts = [{"PartNumber": n, "ETag": etag} for n, etag in enumerate(etags, start=1)]
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload_id,
                MultipartUpload={"Parts": parts},
            )  # fmt: skip
        except ClientError as exc:
            if error_code(exc).startswith("5"):
                raise store_error(exc, "completing an upload") from exc
            raise PackageRejected(
                f"the upload's parts do not complete it ({error_code(exc)}): send them again"
            ) from exc
        except BotoCoreError as exc:
            raise store_error(exc, "completing an upload") from exc

    def _verify(self, digest: str, size: int, key: str) -> None:
        try:
            head = self.store._call(
                "a HEAD of an upload", "head_object", Key=key, ChecksumMode="ENABLED"
            )
        except ClientError:
            raise PackageRejected(f"nothing was uploaded for {digest}") from None
        if int(head["ContentLength"]) != size:
            raise PackageRejected(f"the upload is {head['ContentLength']} bytes, not {size}")
        if head.get("ChecksumSHA256") == checksum_b64(digest):
            return  # the server computed it over the whole object as it was written
        actual = self._hash(key)
        if actual != digest:
            raise PackageRejected(f"uploaded bytes' sha256 is {actual}, not {digest}")

    def _hash(self, key: str) -> str:
        """The verifying read: the staged object's SHA-256, streamed (one chunk in memory)."""
        try:
            return self.store.download(key, None)
        except ClientError:
            raise PackageRejected("the uploaded object is gone") from None
