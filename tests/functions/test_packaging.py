"""Deterministic packaging and content-addressed storage (issue 2, paper §4, A.2)."""

from __future__ import annotations

import os
import tracemalloc
import zipfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path

import pytest

from functions import packaging
from functions.errors import Expired, Forbidden, PackageRejected
from functions.packaging import build_package, package_digest
from functions.stores import UrlSigner

MiB = 1024 * 1024


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


def _sparse(path: Path, size: int) -> Path:
    """A file of ``size`` zero bytes that takes no disk space."""
    with path.open("wb") as f:
        f.truncate(size)
    return path


def _peak_bytes(build: Callable[[], object]) -> int:
    """Most Python heap memory in use at once while ``build`` runs."""
    tracemalloc.start()
    try:
        build()
    except PackageRejected:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


def test_files_are_streamed_into_the_package_not_read_whole(tmp_path: Path) -> None:
    root = tmp_path / "a"
    root.mkdir()
    _sparse(root / "data.bin", 32 * MiB)
    assert _peak_bytes(lambda: build_package(root)) < 8 * MiB


def test_a_tree_over_the_unpacked_cap_is_refused_before_any_file_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pod writes at most MAX_UNPACKED_BYTES: a bigger tree (a stray dataset, a sparse
    file) is refused from the sizes alone, scaled down here to 1 MiB."""
    root = _tree(tmp_path / "a")
    _sparse(root / "big.bin", 4 * MiB)
    monkeypatch.setattr(packaging, "MAX_UNPACKED_BYTES", MiB, raising=False)

    def no_reading(*_: object, **__: object) -> object:
        raise AssertionError("a file was read")

    monkeypatch.setattr(Path, "open", no_reading)
    monkeypatch.setattr(Path, "read_bytes", no_reading)
    with pytest.raises(PackageRejected, match="unpacks to at most"):
        build_package(root)


def test_a_package_over_the_compressed_cap_fails_while_it_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "a"
    root.mkdir()
    (root / "random.bin").write_bytes(os.urandom(16 * MiB))
    monkeypatch.setattr(packaging, "MAX_PACKAGE_BYTES", 256 * 1024)
    with pytest.raises(PackageRejected, match="the cap is 262144"):
        build_package(root)
    assert _peak_bytes(lambda: build_package(root)) < 8 * MiB


@pytest.mark.parametrize(
    "name", ["a/" * 64 + "deep.py", "/".join(["d" * 250] * 5) + "/long.py"], ids=["deep", "long"]
)
def test_a_name_the_pod_would_refuse_is_refused_when_packaging(tmp_path: Path, name: str) -> None:
    root = tmp_path / "a"
    (root / name).parent.mkdir(parents=True)
    (root / name).write_text("x = 1\n")
    with pytest.raises(PackageRejected, match="too long or too deep"):
        build_package(root)


def test_a_colon_in_a_file_name_is_packaged(tmp_path: Path) -> None:
    root = tmp_path / "a"
    root.mkdir()
    (root / "a:b.txt").write_text("x")
    with zipfile.ZipFile(BytesIO(build_package(root))) as zf:
        assert zf.namelist() == ["a:b.txt"]


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


@pytest.mark.parametrize("forged", ["é", "\udc80", "\x00", "ß" * 64])
def test_a_signature_of_any_text_is_refused_as_forbidden(forged: str) -> None:
    """A query string may carry any text: a signature that is not ASCII is refused like any
    other wrong one (``compare_digest`` takes no non-ASCII ``str``, so bytes are compared)."""
    signer = UrlSigner(b"k" * 32)
    with pytest.raises(Forbidden):
        signer.verify("a" * 64, 1000, forged, now=999)
