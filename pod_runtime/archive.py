"""Safe extraction of a verified package zip into the pod's package directory.

Invariants (paper A.2, "rejection of symlinks and paths that escape the workspace"):

* Every entry is validated *before* the first byte is written: relative, normalised names of
  printable characters without backslashes, NULs or ``..``; no duplicate names and no name
  that is both a file and a directory; only regular files and directories (no symlinks,
  devices, FIFOs or sockets, whatever ``external_attr`` claims); no encryption; local headers
  that do not overlap (two central entries sharing data is a known bomb trick); declared sizes
  within the caps and a bounded compression ratio.
* While writing, the bytes actually produced are counted against ``max_written`` (declared
  sizes can lie), files are created with ``O_EXCL | O_NOFOLLOW`` below a directory that was
  empty, so nothing is ever written outside ``dest``.
* On any rejection the partial extraction is removed and ``PackageRejected`` names the reason.

Synchronous and blocking: the agent runs it in a worker thread, one extraction at a time.
"""

from __future__ import annotations

import itertools
import os
import shutil
import stat
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from functions.errors import PackageRejected

MiB = 1024 * 1024
ALLOWED_COMPRESSION = frozenset(
    {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
)
LOCAL_HEADER = struct.Struct("<4s5H3L2H")
LOCAL_MAGIC = b"PK\x03\x04"


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """Caps for one package; defaults follow the paper (512 MiB compressed, 2 GB written)."""

    max_compressed: int = 512 * MiB
    """Bytes of the zip file itself (also enforced while downloading)."""
    max_written: int = 2_000_000_000
    """Bytes written during extraction, counted as they are written."""
    max_files: int = 100_000
    """Entries in the archive (files and directories)."""
    max_ratio: int = 200
    """Largest uncompressed/compressed ratio for an entry bigger than 1 MiB."""


def _check_name(raw: str) -> tuple[str, bool]:
    """Return (normalised relative name, is_dir) or raise PackageRejected."""
    if not raw or "\0" in raw:
        raise PackageRejected(f"entry name {raw!r} is empty or contains NUL")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise PackageRejected(f"entry name {raw!r} contains control characters")
    if "\\" in raw:
        raise PackageRejected(f"entry name {raw!r} contains a backslash")
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
        raise PackageRejected(f"entry name {raw!r} is absolute")
    is_dir = raw.endswith("/")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if not parts:
        raise PackageRejected(f"entry name {raw!r} names the package root")
    if ".." in parts:
        raise PackageRejected(f"entry name {raw!r} escapes the package directory")
    if any(len(p.encode()) > 255 for p in parts) or len(raw.encode()) > 4096:
        raise PackageRejected(f"entry name {raw[:80]!r}... is too long")
    return str(PurePosixPath(*parts)), is_dir


def _local_span(fp: zipfile.ZipFile, info: zipfile.ZipInfo, file_size: int) -> tuple[int, int]:
    """[start, end) of the entry's local header plus data, read from the real local header."""
    handle = fp.fp
    assert handle is not None
    handle.seek(info.header_offset)
    header = handle.read(LOCAL_HEADER.size)
    if len(header) != LOCAL_HEADER.size or header[:4] != LOCAL_MAGIC:
        raise PackageRejected(f"entry {info.filename!r} has no valid local header")
    fields = LOCAL_HEADER.unpack(header)
    name_len, extra_len = fields[-2], fields[-1]
    end = info.header_offset + LOCAL_HEADER.size + name_len + extra_len + info.compress_size
    if end > file_size:
        raise PackageRejected(f"entry {info.filename!r} runs past the end of the archive")
    return info.header_offset, end


def validate(zf: zipfile.ZipFile, file_size: int, limits: ArchiveLimits) -> list[zipfile.ZipInfo]:
    """Check every entry (see module invariants); return them in archive order."""
    infos = zf.infolist()
    if len(infos) > limits.max_files:
        raise PackageRejected(f"archive has {len(infos)} entries (cap {limits.max_files})")
    seen: dict[str, bool] = {}
    declared = 0
    spans: list[tuple[int, int, str]] = []
    for info in infos:
        if "\0" in info.orig_filename:  # zipfile silently cuts names at NUL
            raise PackageRejected(f"entry name {info.orig_filename!r} contains NUL")
        name, is_dir = _check_name(info.filename)
        mode = info.external_attr >> 16
        kind = stat.S_IFMT(mode)
        if kind not in (0, stat.S_IFREG, stat.S_IFDIR):
            raise PackageRejected(f"entry {info.filename!r} is not a regular file (mode {mode:o})")
        if kind == stat.S_IFDIR and not is_dir:
            raise PackageRejected(f"entry {info.filename!r} claims to be a directory")
        if info.flag_bits & 0x1:
            raise PackageRejected(f"entry {info.filename!r} is encrypted")
        if info.compress_type not in ALLOWED_COMPRESSION:
            raise PackageRejected(f"entry {info.filename!r} uses compression {info.compress_type}")
        if name in seen:
            raise PackageRejected(f"duplicate entry {name!r}")
        seen[name] = is_dir
        declared += info.file_size
        if declared > limits.max_written:
            raise PackageRejected(f"archive declares more than {limits.max_written} bytes")
        if info.file_size > MiB and info.file_size > limits.max_ratio * max(info.compress_size, 1):
            raise PackageRejected(f"entry {info.filename!r} has a zip-bomb compression ratio")
        start, end = _local_span(zf, info, file_size)
        spans.append((start, end, info.filename))
    for name in seen:
        parent = str(PurePosixPath(name).parent)
        while parent != ".":
            if seen.get(parent) is False:
                raise PackageRejected(f"entry {name!r} is below the file {parent!r}")
            parent = str(PurePosixPath(parent).parent)
    spans.sort()
    for (_, end, name), (start, _, other) in itertools.pairwise(spans):
        if start < end:
            raise PackageRejected(f"entries {name!r} and {other!r} overlap")
    return infos


def _write_entry(zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: Path, budget: int) -> int:
    mode = 0o755 if (info.external_attr >> 16) & 0o111 else 0o644
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    written = 0
    with os.fdopen(fd, "wb") as out, zf.open(info) as src:
        while chunk := src.read(1 << 20):
            written += len(chunk)
            if written > budget:
                raise PackageRejected("extraction wrote more than the cap")
            out.write(chunk)
    return written


def extract(zip_path: Path, dest: Path, limits: ArchiveLimits) -> int:
    """Extract ``zip_path`` into the empty directory ``dest``; return the number of files.

    Raises ``PackageRejected`` (and leaves ``dest`` empty) when the archive breaks a rule.
    """
    size = zip_path.stat().st_size
    if size > limits.max_compressed:
        raise PackageRejected(f"package is {size} bytes (cap {limits.max_compressed})")
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise PackageRejected(f"package directory {dest} is not empty")
    files = 0
    try:
        with zipfile.ZipFile(zip_path) as zf:
            infos = validate(zf, size, limits)
            budget = limits.max_written
            for info in infos:
                name, is_dir = _check_name(info.filename)
                target = dest / name
                if is_dir:
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                budget -= _write_entry(zf, info, target, budget)
                files += 1
    except PackageRejected:
        _empty(dest)
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError) as exc:
        _empty(dest)
        raise PackageRejected(f"package is not a valid zip: {exc}") from exc
    except NotImplementedError as exc:
        _empty(dest)
        raise PackageRejected(f"package uses an unsupported zip feature: {exc}") from exc
    return files


def _empty(directory: Path) -> None:
    for child in list(directory.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
