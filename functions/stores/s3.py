"""``S3PackageStore``: packages as objects in an S3 bucket (AWS S3 or an S3-compatible server).

Keys: ``<prefix>packages/<sha256>.zip`` for stored packages (a requirements file too: every
package is named by its own digest), ``<prefix>uploads/<sha256>/<token>`` for bytes a client
sent straight to the bucket and the broker has not verified yet (``functions.stores.s3_uploads``).
Nothing is written under a package's key before its bytes are known to hash to its digest:
the broker's own puts send ``x-amz-checksum-sha256`` (the server refuses other bytes) and a
conditional ``If-None-Match: *`` (of concurrent puts exactly one creates the object); a
client's upload is verified in staging and copied into place server-side.

Pods fetch a presigned GET (``url``) straight from the bucket: the broker serves no byte of
it (``check_url`` refuses every ``/v1/blobs`` URL). Credentials come from the standard AWS
chain (environment, shared config, instance or pod role); endpoint, bucket, region and
addressing style from ``S3Config``.

Faults: a server that cannot be reached, answers 5xx, or refuses the broker's credentials is
``StoreUnavailable`` (503 with ``Retry-After`` at the API); nothing half-done stays visible.

Blocking: every method but ``upload``, ``url``, ``check_url`` and ``local_path`` makes
network calls (call them from a worker thread). boto3 clients are thread-safe; one is shared.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from functions.errors import Forbidden, NotFound, PackageRejected, StoreUnavailable
from functions.spec import DIGEST_RE
from functions.stores.base import Check, HashingUpload, StoredPackage, check_digest_syntax

CHUNK = 1 << 20
MIN_PART_BYTES = 5 * 1024 * 1024
"""S3's smallest part of a multipart upload (every part but the last)."""
_MISSING = frozenset({"404", "NoSuchKey", "NotFound", "NoSuchUpload"})
_TAKEN = frozenset({"412", "PreconditionFailed", "ConditionalRequestConflict"})


@dataclass(frozen=True, slots=True)
class S3Config:
    """Where the bucket is; each field is a ``Settings`` field (``FIREPOOL_S3_*``)."""

    bucket: str
    endpoint_url: str | None = None
    """None: AWS S3 for ``region``; else an S3-compatible server (MinIO, SeaweedFS, R2...)."""
    region: str | None = None
    """None: the AWS chain's (``AWS_REGION``, shared config), else ``us-east-1``."""
    path_style: bool = False
    """``endpoint/bucket/key`` URLs instead of ``bucket.endpoint/key`` (most self-hosted
    servers need this: their buckets have no DNS names)."""
    url_ttl_s: int = 300
    """Lifetime of every presigned URL (a pod's GET, a client's PUT)."""
    prefix: str = ""
    """Prepended to every key (several brokers sharing one bucket)."""
    part_bytes: int = 64 * 1024 * 1024
    """A client's upload larger than this is sent as a multipart upload of parts this size."""


def checksum_b64(digest: str) -> str:
    """A hex SHA-256 as S3's ``x-amz-checksum-sha256`` writes it (base64 of the raw bytes)."""
    return base64.b64encode(bytes.fromhex(digest)).decode()


def store_error(exc: Exception, doing: str) -> StoreUnavailable:
    """A boto3 failure as the typed error the API answers 503 + ``Retry-After`` for."""
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "?")
        return StoreUnavailable(f"the object store refused {doing}: {code}")
    return StoreUnavailable(f"the object store is unreachable ({doing}): {type(exc).__name__}")


def error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def make_client(config: S3Config) -> Any:
    """A boto3 S3 client for ``config``: SigV4, short timeouts and two tries, so a store that
    is down fails a request in seconds rather than hanging it."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=config.endpoint_url,
        region_name=config.region or "us-east-1",
        config=Config(
            signature_version="s3v4",
            s3={"addressing_style": "path" if config.path_style else "auto"},
            connect_timeout=2,
            read_timeout=30,
            retries={"max_attempts": 2, "mode": "standard"},
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        ),
    )


class S3PackageStore:
    """A ``PackageStore`` over one bucket (which must exist); thread-safe."""

    def __init__(self, config: S3Config, client: Any | None = None) -> None:
        self.config = config
        self.bucket = config.bucket
        self.client = client if client is not None else make_client(config)

    # -- keys ----------------------------------------------------------------------------
    def key(self, digest: str) -> str:
        check_digest_syntax(digest)
        return f"{self.config.prefix}packages/{digest}.zip"

    def _call(self, doing: str, method: str, **kwargs: Any) -> Any:
        """``client.<method>(Bucket=..., **kwargs)``; boto3's failures as ``StoreUnavailable``
        except the ``ClientError``s a caller handles (missing, precondition failed)."""
        try:
            return getattr(self.client, method)(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            if error_code(exc) in _MISSING | _TAKEN:
                raise
            raise store_error(exc, doing) from exc
        except BotoCoreError as exc:
            raise store_error(exc, doing) from exc

    # -- the PackageStore protocol -------------------------------------------------------
    def upload(self, digest: str) -> S3Upload:
        return S3Upload(self, digest)

    def exists(self, digest: str) -> bool:
        return self.object_size(self.key(digest)) is not None

    def object_size(self, key: str) -> int | None:
        """The size of the object ``key``, None when there is none."""
        try:
            head = self._call(f"a HEAD of {key}", "head_object", Key=key)
        except ClientError:
            return None
        return int(head["ContentLength"])

    def open(self, digest: str) -> BinaryIO:
        """The package downloaded into a temporary file (seekable, removed when closed)."""
        copy = tempfile.TemporaryFile(prefix="package-")  # noqa: SIM115 (the caller closes it)
        try:
            self.download(self.key(digest), copy)
        except ClientError:
            copy.close()
            raise NotFound(f"no package {digest}") from None
        except BaseException:
            copy.close()
            raise
        copy.seek(0)
        return cast(BinaryIO, copy)

    def download(self, key: str, out: IO[bytes] | None) -> str:
        """Stream the object ``key`` into ``out`` (None: only hash it); return the SHA-256 of
        its bytes.
        ``ClientError`` (missing) when there is no such object."""
        body = self._call(f"a GET of {key}", "get_object", Key=key)["Body"]
        hasher = hashlib.sha256()
        try:
            with body:
                while chunk := body.read(CHUNK):
                    hasher.update(chunk)
                    if out is not None:
                        out.write(chunk)
        except BotoCoreError as exc:  # the connection dropped mid-body
            raise store_error(exc, f"a GET of {key}") from exc
        return hasher.hexdigest()

    def local_path(self, digest: str) -> Path | None:
        check_digest_syntax(digest)
        return None

    def url(self, digest: str, now: float | None = None) -> str:
        """A presigned GET valid ``url_ttl_s`` from ``now``. S3 signs at the current time, so
        a ``now`` in the past shortens the URL's life (to 1 s at least) rather than moving
        its start."""
        key = self.key(digest)
        ttl = self.config.url_ttl_s
        if now is not None:
            ttl = max(1, round(now + ttl - time.time()))
        return str(
            self.client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=ttl
            )
        )

    def check_url(self, digest: str, expires: int, signature: str, now: float) -> None:
        raise Forbidden("packages of this broker are fetched from the object store")

    def delete(self, digest: str) -> bool:
        key = self.key(digest)
        if self.object_size(key) is None:
            return False
        self._call(f"a DELETE of {key}", "delete_object", Key=key)
        return True

    def list(self) -> Iterator[StoredPackage]:
        prefix = f"{self.config.prefix}packages/"
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        try:
            for page in pages:
                for item in page.get("Contents", []):
                    name = item["Key"][len(prefix) :].removesuffix(".zip")
                    if DIGEST_RE.fullmatch(name):
                        stamp = item["LastModified"].timestamp()
                        yield StoredPackage(name, int(item["Size"]), stamp)
        except (ClientError, BotoCoreError) as exc:
            raise store_error(exc, "a LIST of packages") from exc

    # -- writes --------------------------------------------------------------------------
    def put_verified(self, digest: str, file: IO[bytes], size: int) -> bool:
        """Put ``file`` (``size`` bytes hashing to ``digest``) under the digest's key unless
        it is there; whether this call created it. The server checks the checksum, and the
        conditional put lets exactly one of concurrent writers create the object."""
        try:
            self._call(
                f"a PUT of {digest}", "put_object", Key=self.key(digest), Body=file,
                ContentLength=size, ChecksumSHA256=checksum_b64(digest), IfNoneMatch="*",
            )  # fmt: skip
        except ClientError as exc:
            if error_code(exc) in _TAKEN:
                return False
            raise store_error(exc, f"a PUT of {digest}") from exc
        return True

    def copy_into_place(self, source_key: str, digest: str) -> bool:
        """Copy the verified object ``source_key`` to the digest's key unless it is there
        (server-side: no byte passes the broker); whether this call created it."""
        try:
            self._call(
                f"a COPY of {digest}", "copy_object", Key=self.key(digest),
                CopySource={"Bucket": self.bucket, "Key": source_key}, IfNoneMatch="*",
            )  # fmt: skip
        except ClientError as exc:
            if error_code(exc) in _TAKEN:
                return False
            raise PackageRejected(f"the uploaded object is gone ({error_code(exc)})") from exc
        return True

    def delete_key(self, key: str) -> None:
        """Remove the object ``key`` if there is one (best effort: a staging leftover)."""
        with contextlib.suppress(ClientError, BotoCoreError):
            self.client.delete_object(Bucket=self.bucket, Key=key)


class S3Upload(HashingUpload):
    """A ``PackageUpload`` staged in a local temporary file (``check`` reads it there), put to
    the bucket with its checksum on commit."""

    def __init__(self, store: S3PackageStore, digest: str) -> None:
        super().__init__(digest)
        self._store = store
        self._file = tempfile.NamedTemporaryFile(prefix="upload-")  # noqa: SIM115 (``close``)

    def _append(self, chunk: bytes) -> None:
        self._file.write(chunk)

    def commit(self, check: Check | None = None) -> bool:
        self._check_hash()
        if self._store.exists(self.digest):
            return False
        self._file.flush()
        if check is not None:
            check(Path(self._file.name))
        self._file.seek(0)
        return self._store.put_verified(self.digest, self._file, self.size)

    def close(self) -> None:
        self._file.close()
