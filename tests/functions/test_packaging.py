"""Deterministic packaging and content-addressed storage (issue 2, paper §4, A.2)."""

from __future__ import annotations

import hashlib
import os
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from io import BytesIO
from pathlib import Path

import pytest

from functions.errors import Expired, Forbidden, PackageRejected
from functions.package_store import LocalPackageStore, UrlSigner
from functions.packaging import build_package, package_digest


def _tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("def f(x):\n    return x\n")
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"junk")
    return root


def test_the_same_tree_always_gives_the_same_digest(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a")
    b = _tree(tmp_path / "b")
    os.utime(b / "pkg" / "mod.py", (1_000_000, 1_000_000))
    assert package_digest(a)[0] == package_digest(b)[0]


def test_a_changed_file_changes_the_digest(tmp_path: Path) -> None:
    a = _tree(tmp_path / "a")
    before = package_digest(a)[0]
    (a / "pkg" / "mod.py").write_text("def f(x):\n    return 2 * x\n")
    assert package_digest(a)[0] != before


def test_entries_are_sorted_dated_1980_and_caches_are_left_out(tmp_path: Path) -> None:
    data = build_package(_tree(tmp_path / "a"))
    with zipfile.ZipFile(BytesIO(data)) as zf:
        names = zf.namelist()
        assert names == sorted(names) == ["pkg/mod.py", "run.sh"]
        assert all(i.date_time == (1980, 1, 1, 0, 0, 0) for i in zf.infolist())
        assert (zf.getinfo("run.sh").external_attr >> 16) & 0o777 == 0o755
        assert (zf.getinfo("pkg/mod.py").external_attr >> 16) & 0o777 == 0o644


def test_symlinks_are_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path / "a")
    (root / "link").symlink_to("/etc/passwd")
    with pytest.raises(PackageRejected):
        build_package(root)


def test_the_store_checks_the_digest_and_dedupes(tmp_path: Path) -> None:
    store = LocalPackageStore(tmp_path / "s", UrlSigner(b"k" * 32), "http://x")
    data = b"payload"
    digest = hashlib.sha256(data).hexdigest()
    with pytest.raises(PackageRejected):
        store.put(hashlib.sha256(b"other").hexdigest(), data)
    assert store.put(digest, data) is True
    assert store.put(digest, data) is False
    assert store.read(digest) == data
    assert list((tmp_path / "s").rglob(".upload-*")) == []


def test_of_concurrent_uploads_of_one_digest_exactly_one_created_it(tmp_path: Path) -> None:
    """Both writers pass the existence check before either publishes (the barrier in
    ``check`` holds them there); only one may be told it created the package."""
    store = LocalPackageStore(tmp_path / "s", UrlSigner(b"k" * 32), "http://x")
    data = b"payload"
    digest = hashlib.sha256(data).hexdigest()
    both_written = threading.Barrier(2, timeout=10)

    def wait_for_the_other(_: Path) -> None:
        both_written.wait()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: store.put(digest, data, wait_for_the_other), range(2)))
    assert sorted(results) == [False, True]
    assert store.read(digest) == data
    assert list((tmp_path / "s").rglob(".upload-*")) == []


def test_signed_urls_expire_and_reject_tampering() -> None:
    signer = UrlSigner(b"k" * 32)
    digest = "a" * 64
    sig = signer.sign(digest, 1000)
    signer.verify(digest, 1000, sig, now=999)
    with pytest.raises(Expired):
        signer.verify(digest, 1000, sig, now=1001)
    with pytest.raises(Forbidden):
        signer.verify(digest, 2000, sig, now=999)
    with pytest.raises(Forbidden):
        signer.verify("b" * 64, 1000, sig, now=999)
