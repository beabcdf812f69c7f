"""Package stores: the ``PackageStore`` seam (``base``) and its implementations, chosen by name.

``local`` keeps packages as files under the broker's home (the default); ``memory`` keeps them
in the process (fast tests, demos). Both hand pods signed URLs the broker serves
(``signed_urls``). ``tests/functions/test_package_store_contract.py`` runs one contract suite
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
from functions.stores.signed_urls import BlobUrls, UrlSigner

__all__ = [
    "PACKAGE_STORES",
    "BlobUrls",
    "LocalPackageStore",
    "MemoryPackageStore",
    "PackageStore",
    "PackageUpload",
    "StoredPackage",
    "UrlSigner",
    "check_digest_syntax",
    "local_file",
    "open_package_store",
]

PACKAGE_STORES = ("local", "memory")
"""The store names ``open_package_store`` builds (what ``FIREPOOL_PACKAGE_STORE`` accepts)."""


def open_package_store(
    kind: str, *, root: Path, signer: UrlSigner, base_url: str, ttl_s: int
) -> PackageStore:
    """The store named ``kind``: ``local`` under ``root``, or ``memory``; each signs pods' URLs
    with ``signer``, below ``base_url``, valid ``ttl_s`` seconds. ``InvalidRequest`` (field
    ``package_store``) naming the known stores for any other name."""
    if kind == "local":
        return LocalPackageStore(root, signer, base_url, ttl_s)
    if kind == "memory":
        return MemoryPackageStore(signer, base_url, ttl_s)
    raise InvalidRequest(
        f"unknown package store {kind!r}; the stores are: {', '.join(PACKAGE_STORES)}",
        field="package_store",
    )
