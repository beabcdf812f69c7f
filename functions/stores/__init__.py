"""Package stores: the ``PackageStore`` seam (``base``) and its implementations, chosen by name.

``local`` keeps packages as files under the broker's home (the default); ``memory`` keeps them
in the process (fast tests, demos). Both hand pods signed URLs the broker serves
(``signed_urls``). ``s3`` keeps them in a bucket (``s3``) and hands pods presigned URLs of
the object store, which clients also upload to directly (``s3_uploads``).
 ``tests/functions/test_package_store_contract.py`` runs one contract suite
over every store named here.
"""

from __future__ import annotations

from pathlib import Path

from functions.errors import InvalidRequest
from functions.stores.base import (
    PackageStore,
    PackageUpload,
    StoredPackage,
    check_digest_syntax,
    local_file,
)
from functions.stores.local import LocalPackageStore
from functions.stores.memory import MemoryPackageStore
from functions.stores.s3 import S3Config, S3PackageStore
from functions.stores.signed_urls import BlobUrls, UrlSigner

__all__ = [
    "PACKAGE_STORES",
    "BlobUrls",
    "LocalPackageStore",
    "MemoryPackageStore",
    "PackageStore",
    "PackageUpload",
    "S3Config",
    "S3PackageStore",
    "StoredPackage",
    "UrlSigner",
    "check_digest_syntax",
    "local_file",
    "open_package_store",
]

PACKAGE_STORES = ("local", "memory", "s3")
"""The store names ``open_package_store`` builds (what ``FIREPOOL_PACKAGE_STORE`` accepts)."""


def open_package_store(
    kind: str,
    *,
    root: Path,
    signer: UrlSigner,
    base_url: str,
    ttl_s: int,
    s3: S3Config | None = None,
) -> PackageStore:
    """The store named ``kind``: ``local`` under ``root``, or ``memory``, each signing pods'
    URLs with ``signer``, below ``base_url``, valid ``ttl_s`` seconds; or ``s3``, the bucket
    ``s3`` names (``InvalidRequest``, field ``FIREPOOL_S3_BUCKET``, without one).
    ``InvalidRequest`` (field ``package_store``) naming the known stores for any other name."""
    if kind == "local":
        return LocalPackageStore(root, signer, base_url, ttl_s)
    if kind == "memory":
        return MemoryPackageStore(signer, base_url, ttl_s)
    if kind == "s3":
        if s3 is None or not s3.bucket:
            raise InvalidRequest(
                "the s3 package store needs a bucket (FIREPOOL_S3_BUCKET)",
                field="FIREPOOL_S3_BUCKET",
            )
        return S3PackageStore(s3)
    raise InvalidRequest(
        f"unknown package store {kind!r}; the stores are: {', '.join(PACKAGE_STORES)}",
        field="package_store",
    )
