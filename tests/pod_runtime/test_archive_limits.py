"""Archive caps that keep extraction cheap (paper A.2): names short and shallow, directories
counted, ratios bounded for the whole archive, no entry inflating past what it declared, and
every failure a ``PackageRejected`` that names no host path. The gateway's upload check and the
pod's extraction give the same verdict."""

from __future__ import annotations

import io
import struct
import sys
import traceback
import zipfile
from collections.abc import Generator
from pathlib import Path

import pytest

from broker.package_check import check_package_file
from functions.errors import PackageRejected
from pod_runtime import archive
from pod_runtime.archive import ArchiveLimits, extract

MiB = 1024 * 1024
SMALL = ArchiveLimits(max_compressed=12 * MiB, max_written=8 * MiB, max_files=500)


def _zip(entries: list[tuple[str, bytes]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            zf.writestr(name, data)
    return buf.getvalue()


def _archive(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "package.zip"
    path.write_bytes(data)
    return path


def _both_reject(tmp_path: Path, data: bytes, limits: ArchiveLimits = SMALL) -> list[str]:
    """The messages of the upload check and of the pod's extraction; both must reject, and
    the pod must leave its package directory empty."""
    path = _archive(tmp_path, data)
    dest = tmp_path / "pkg"
    dest.mkdir()
    messages = []
    with pytest.raises(PackageRejected) as at_upload:
        check_package_file(path, limits)
    messages.append(at_upload.value.message)
    with pytest.raises(PackageRejected) as at_pod:
        extract(path, dest, limits)
    messages.append(at_pod.value.message)
    assert list(dest.iterdir()) == []
    return messages


def _deep(levels: int, leaf: str = "f.py") -> str:
    return "a/" * (levels - 1) + leaf


def test_a_name_deeper_than_the_cap_is_refused_at_upload_and_at_the_pod(tmp_path: Path) -> None:
    assert SMALL.max_depth == 64
    for message in _both_reject(tmp_path, _zip([(_deep(65), b"x")])):
        assert "65 levels deep" in message


def test_a_name_at_the_depth_cap_extracts(tmp_path: Path) -> None:
    path = _archive(tmp_path, _zip([(_deep(64), b"x")]))
    check_package_file(path, SMALL)
    assert extract(path, tmp_path / "pkg", SMALL) == 1
    assert (tmp_path / "pkg" / _deep(64)).read_bytes() == b"x"


def test_a_path_deeper_than_the_recursion_limit_is_rejected_not_a_crash(tmp_path: Path) -> None:
    """1500 levels once made ``os.makedirs`` raise RecursionError: an untyped, retried error."""
    for message in _both_reject(tmp_path, _zip([(_deep(1500), b"x")])):
        assert "levels deep" in message or "longer than" in message


def test_directories_are_made_without_recursion(tmp_path: Path) -> None:
    """With the caps raised and only 150 frames of stack to spare, a 400-level tree extracts:
    no step recurses per level. (Deeper trees would break pytest's own recursive cleanup.)"""
    deep = ArchiveLimits(max_depth=500, max_name_bytes=1000, max_files=500)
    path = _archive(tmp_path, _zip([(_deep(400), b"x")]))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(traceback.extract_stack()) + 150)
    try:
        files = extract(path, tmp_path / "p", deep)
    finally:
        sys.setrecursionlimit(limit)
    assert files == 1
    assert (tmp_path / "p" / _deep(400)).read_bytes() == b"x"


def test_directories_that_names_only_imply_count_against_the_cap(tmp_path: Path) -> None:
    """Ten entries 60 levels deep imply 600 directories: over the cap of 500, though the
    archive has only ten entries."""
    data = _zip([(f"d{i}/" + _deep(59), b"x") for i in range(10)])
    for message in _both_reject(tmp_path, data):
        assert "more than 500 directories" in message


def test_shared_parents_are_counted_once(tmp_path: Path) -> None:
    data = _zip([(_deep(60, f"f{i}.py"), b"x") for i in range(400)])
    path = _archive(tmp_path, data)
    check_package_file(path, SMALL)
    assert extract(path, tmp_path / "pkg", SMALL) == 400


def test_a_name_longer_than_the_cap_is_refused_at_upload(tmp_path: Path) -> None:
    """Under 4096 bytes but, with the pod's directory prefix, once over PATH_MAX: now refused
    at deploy instead of failing every job."""
    name = "/".join(["d" * 250] * 16) + "/f.py"
    assert 1024 < len(name) < 4096
    for message in _both_reject(tmp_path, _zip([(name, b"x")])):
        assert "longer than 1024 bytes" in message


def test_an_extraction_error_never_names_the_host_path(tmp_path: Path) -> None:
    """A pod directory so long that a legal name passes PATH_MAX: the job's error names the
    entry, never where the pod lives on the host."""
    dest = tmp_path.joinpath(*["p" * 250] * 13)
    dest.mkdir(parents=True)
    name = "/".join(["n" * 199] * 5)
    assert len(str(dest)) + len(name) > 4096
    with pytest.raises(PackageRejected) as rejected:
        extract(_archive(tmp_path, _zip([(name, b"x")])), dest, SMALL)
    assert "could not be extracted" in rejected.value.message
    assert str(tmp_path) not in rejected.value.message
    assert list(dest.iterdir()) == []


def test_a_busy_package_directory_is_reported_without_its_path(tmp_path: Path) -> None:
    dest = tmp_path / "pkg"
    dest.mkdir()
    (dest / "left.py").write_bytes(b"")
    with pytest.raises(PackageRejected) as rejected:
        extract(_archive(tmp_path, _zip([("a.py", b"x")])), dest, SMALL)
    assert str(tmp_path) not in rejected.value.message


def test_an_unexpected_error_while_extracting_is_a_package_rejection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not ``InternalError`` (retried on fresh pods): the package is at fault."""
    dest = tmp_path / "pkg"

    def explode(*_: object) -> int:
        raise RuntimeError(f"boom in {dest}")

    monkeypatch.setattr(archive, "_write_entry", explode)
    with pytest.raises(PackageRejected) as rejected:
        extract(_archive(tmp_path, _zip([("a.py", b"x")])), dest, SMALL)
    assert "RuntimeError" in rejected.value.message
    assert str(tmp_path) not in rejected.value.message
    assert list(dest.iterdir()) == []


def test_entries_just_under_the_per_entry_ratio_rule_break_the_archive_ratio(
    tmp_path: Path,
) -> None:
    """Seven entries of exactly 1 MiB of zeros (the per-entry rule starts above 1 MiB): a
    7 KB zip that would write 7 MiB."""
    data = _zip([(f"z{i}", b"\0" * MiB) for i in range(7)])
    assert 7 * MiB > SMALL.max_ratio * len(data)
    for message in _both_reject(tmp_path, data):
        assert "compression ratio" in message


def test_a_small_archive_of_compressible_files_is_not_a_bomb(tmp_path: Path) -> None:
    """Under 1 MiB declared, the whole-archive ratio does not apply."""
    path = _archive(tmp_path, _zip([(f"z{i}", b"\0" * 100_000) for i in range(10)]))
    check_package_file(path, SMALL)
    assert extract(path, tmp_path / "pkg", SMALL) == 10


def _liar(real: int, declared: int) -> bytes:
    """One entry declaring ``declared`` bytes whose data inflates to ``real`` zeros."""
    raw = bytearray(_zip([("bomb.bin", b"\0" * real)]))
    for magic, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = raw.index(magic)
        struct.pack_into("<L", raw, at + offset, declared)
    return bytes(raw)


def test_an_entry_is_stopped_as_soon_as_it_inflates_past_its_declared_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inflated = 0
    chunks = archive._chunks

    def counting(entry: archive.Entry, view: memoryview, zf: zipfile.ZipFile) -> Generator[bytes]:
        nonlocal inflated
        for chunk in chunks(entry, view, zf):
            inflated += len(chunk)
            yield chunk

    monkeypatch.setattr(archive, "_chunks", counting)
    data = _liar(6 * MiB, 10)
    check_package_file(_archive(tmp_path, data), SMALL)  # nothing declared is over a cap
    dest = tmp_path / "pkg"
    with pytest.raises(PackageRejected) as rejected:
        extract(_archive(tmp_path, data), dest, SMALL)
    assert "past its declared size" in rejected.value.message
    assert inflated <= archive.CHUNK
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize("name", ["a:b.txt", "C:/x.py", "c:", "dir/x:y"])
def test_a_colon_is_an_ordinary_character_in_a_posix_name(tmp_path: Path, name: str) -> None:
    path = _archive(tmp_path, _zip([(name, b"x")]))
    check_package_file(path, SMALL)
    assert extract(path, tmp_path / "pkg", SMALL) == 1
    assert (tmp_path / "pkg" / name).read_bytes() == b"x"
