"""Safe extraction of a verified package zip into the pod's package directory.

Invariants (paper A.2, "rejection of symlinks and paths that escape the workspace"):

* Every entry is validated *before* the first byte is written: relative, normalised names of
  printable characters without backslashes, NULs or ``..``, short and shallow enough (total
  bytes, bytes per component, components); no duplicate names and no name that is both a file
  and a directory; only regular files and directories (no symlinks, devices, FIFOs or sockets,
  whatever ``external_attr`` claims); no encryption; local headers that do not overlap (two
  central entries sharing data is a known bomb trick); declared sizes within the caps and a
  bounded compression ratio, per entry and for the whole archive; a bounded number of
  directories, the ones the names only imply included. So the work extraction does is linear
  in the caps, whatever the archive.
* While writing, no entry produces more bytes than it declared (declared sizes can lie: it is
  stopped at the first chunk past them), the bytes actually produced are counted against
  ``max_written``, directories are made one level at a time (no recursion), and files are
  created with ``O_EXCL | O_NOFOLLOW`` below a directory that was empty, so nothing is ever
  written outside ``dest``.
* On any failure the partial extraction is removed and ``PackageRejected`` names the reason,
  with entry names relative to the package: no host path reaches the caller.

Synchronous and blocking: the agent runs it in a worker thread, one extraction at a time.
"""

from __future__ import annotations

import itertools
import mmap
import os
import re
import shutil
import stat
import struct
import zipfile
import zlib
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

from functions.errors import PackageRejected

MiB = 1024 * 1024
ALLOWED_COMPRESSION = frozenset(
    {zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA}
)
MALFORMED_ZIP_ERRORS = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    zlib.error,
    EOFError,
    OSError,
    ValueError,  # UnicodeDecodeError too: a name flagged UTF-8 that is not
)
"""What ``zipfile`` raises on a malformed archive (offsets, headers, names, data)."""
LOCAL_HEADER = struct.Struct("<4s5H3L2H")
LOCAL_MAGIC = b"PK\x03\x04"
CHUNK = 1 << 20
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


NAME_MAX = 255
"""Bytes in one path component (Linux ``NAME_MAX``)."""


@dataclass(frozen=True, slots=True)
class ArchiveLimits:
    """Caps for one package; defaults follow the paper (512 MiB compressed, 2 GB written).

    Together they bound the work of one extraction: at most ``max_files`` entries and as many
    directories, each name at most ``max_depth`` components deep, so directory creation is
    linear in the caps; and ``max_name_bytes`` keeps any name plus the pod's directory prefix
    below ``PATH_MAX`` (4096), so a name the gateway accepts can always be created at the pod.
    """

    max_compressed: int = 512 * MiB
    """Bytes of the zip file itself (also enforced while downloading)."""
    max_written: int = 2_000_000_000
    """Bytes written during extraction, counted as they are written; the sizes the entries
    declare must sum within it too."""
    max_files: int = 100_000
    """Entries in the archive (files and directories); also the cap on the directories that
    extraction creates, counting the parents that names only imply (``a/b/c.py`` implies
    ``a`` and ``a/b``)."""
    max_ratio: int = 200
    """Largest uncompressed/compressed ratio for an entry bigger than 1 MiB, and for the whole
    archive (declared bytes over zip bytes) once it declares more than 1 MiB."""
    max_depth: int = 64
    """Components in one entry name (``a/b/c.py`` has 3)."""
    max_name_bytes: int = 1024
    """UTF-8 bytes in one entry name as stored; each component is also at most ``NAME_MAX``
    (255) bytes."""


DEFAULT_LIMITS = ArchiveLimits()


def _check_name(raw: str, limits: ArchiveLimits = DEFAULT_LIMITS) -> tuple[str, bool]:
    """Return (normalised relative name, is_dir) or raise PackageRejected.

    Absolute means absolute on POSIX (a leading ``/``): ``a:b.txt`` and ``C:/x`` are plain
    relative names here. Backslashes are refused outright, so no name means one thing on
    Linux and another where ``\\`` separates paths.
    """
    if not raw or "\0" in raw:
        raise PackageRejected(f"entry name {raw!r} is empty or contains NUL")
    if _CONTROL.search(raw):
        raise PackageRejected(f"entry name {raw!r} contains control characters")
    if "\\" in raw:
        raise PackageRejected(f"entry name {raw!r} contains a backslash")
    if raw.startswith("/"):
        raise PackageRejected(f"entry name {raw!r} is absolute")
    if len(raw.encode()) > limits.max_name_bytes:
        raise PackageRejected(
            f"entry name {raw[:80]!r}... is longer than {limits.max_name_bytes} bytes"
        )
    is_dir = raw.endswith("/")
    parts = [p for p in raw.split("/") if p not in ("", ".")]
    if not parts:
        raise PackageRejected(f"entry name {raw!r} names the package root")
    if ".." in parts:
        raise PackageRejected(f"entry name {raw!r} escapes the package directory")
    if any(len(p.encode()) > NAME_MAX for p in parts):
        raise PackageRejected(f"entry name {raw[:80]!r}... has a component over {NAME_MAX} bytes")
    if len(parts) > limits.max_depth:
        raise PackageRejected(
            f"entry name {raw[:80]!r}... is {len(parts)} levels deep (cap {limits.max_depth})"
        )
    return "/".join(parts), is_dir


@dataclass(frozen=True, slots=True)
class Entry:
    """A validated entry: its normalised name and where its compressed bytes are."""

    info: zipfile.ZipInfo
    name: str
    is_dir: bool
    data_start: int
    data_end: int


def _data_span(mm: mmap.mmap, info: zipfile.ZipInfo, size: int) -> tuple[int, int]:
    """[data start, data end) from the entry's real local header (not the central copy)."""
    at = info.header_offset
    header = mm[at : at + LOCAL_HEADER.size]
    if len(header) != LOCAL_HEADER.size or header[:4] != LOCAL_MAGIC:
        raise PackageRejected(f"entry {info.filename!r} has no valid local header")
    fields = LOCAL_HEADER.unpack(header)
    name_len, extra_len = fields[-2], fields[-1]
    if mm[at + LOCAL_HEADER.size : at + LOCAL_HEADER.size + name_len] != info.orig_filename.encode(
        "utf-8" if info.flag_bits & 0x800 else "cp437", "replace"
    ):
        raise PackageRejected(f"entry {info.filename!r} disagrees with its local header")
    start = at + LOCAL_HEADER.size + name_len + extra_len
    end = start + info.compress_size
    if end > size:
        raise PackageRejected(f"entry {info.filename!r} runs past the end of the archive")
    return start, end


def validate(zf: zipfile.ZipFile, mm: mmap.mmap, size: int, limits: ArchiveLimits) -> list[Entry]:
    """Check every entry (see module invariants); return them in archive order."""
    infos = zf.infolist()
    if len(infos) > limits.max_files:
        raise PackageRejected(f"archive has {len(infos)} entries (cap {limits.max_files})")
    seen: dict[str, bool] = {}
    declared = 0
    entries: list[Entry] = []
    for info in infos:
        if "\0" in info.orig_filename:  # zipfile silently cuts names at NUL
            raise PackageRejected(f"entry name {info.orig_filename!r} contains NUL")
        name, is_dir = _check_name(info.filename, limits)
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
        start, end = _data_span(mm, info, size)
        entries.append(Entry(info, name, is_dir, start, end))
    if declared > MiB and declared > limits.max_ratio * size:
        raise PackageRejected(
            f"archive declares {declared} bytes from {size}: a zip-bomb compression ratio"
        )
    _directories(seen, limits.max_files)
    spans = sorted((e.info.header_offset, e.data_end, e.name) for e in entries)
    for (_, end, name), (start, _, other) in itertools.pairwise(spans):
        if start < end:
            raise PackageRejected(f"entries {name!r} and {other!r} overlap")
    return entries


def _parent(name: str) -> str:
    """``a/b`` for ``a/b/c``; ``""`` (the package root) for a top-level name."""
    return name.rpartition("/")[0]


def _directories(seen: dict[str, bool], cap: int) -> set[str]:
    """The directories extraction creates (explicit and implied), checked: none is a file's
    name and there are at most ``cap``.

    Each name's parents are walked only until one already counted (its own parents were walked
    then), so the cost is linear in the names and the directories, not in their depth squared.
    """
    dirs: set[str] = set()
    for name, is_dir in seen.items():
        folder = name if is_dir else _parent(name)
        while folder and folder not in dirs:
            if seen.get(folder) is False:
                raise PackageRejected(f"entry {name!r} is below the file {folder!r}")
            dirs.add(folder)
            folder = _parent(folder)
        if len(dirs) > cap:
            raise PackageRejected(f"archive implies more than {cap} directories")
    return dirs


def _chunks(entry: Entry, view: memoryview, zf: zipfile.ZipFile) -> Generator[bytes]:
    """The entry's uncompressed bytes: stored and deflate straight from the mapping."""
    data = view[entry.data_start : entry.data_end]
    try:
        yield from _decoded(entry, data, zf)
    finally:
        data.release()  # the mapping cannot be closed while a view of it is alive


def _decoded(entry: Entry, data: memoryview, zf: zipfile.ZipFile) -> Iterator[bytes]:
    kind = entry.info.compress_type
    if kind == zipfile.ZIP_STORED:
        for at in range(0, len(data), CHUNK):
            yield bytes(data[at : at + CHUNK])
    elif kind == zipfile.ZIP_DEFLATED:
        inflater = zlib.decompressobj(-15)
        for at in range(0, len(data), CHUNK):
            out = inflater.decompress(data[at : at + CHUNK], CHUNK)
            while True:
                if out:
                    yield out
                if not inflater.unconsumed_tail:
                    break
                out = inflater.decompress(inflater.unconsumed_tail, CHUNK)
        if tail := inflater.flush():
            yield tail
        if not inflater.eof:
            raise PackageRejected(f"entry {entry.name!r} has a truncated deflate stream")
    else:
        with zf.open(entry.info) as src:
            while chunk := src.read(CHUNK):
                yield chunk


def _write_entry(
    entry: Entry, view: memoryview, zf: zipfile.ZipFile, target: str, budget: int
) -> int:
    """Write one file; stop at the first chunk that takes it past its declared size."""
    mode = 0o755 if (entry.info.external_attr >> 16) & 0o111 else 0o644
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    written = crc = 0
    chunks = _chunks(entry, view, zf)
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                written += len(chunk)
                if written > entry.info.file_size:
                    raise PackageRejected(f"entry {entry.name!r} inflates past its declared size")
                if written > budget:
                    raise PackageRejected("extraction wrote more than the cap")
                crc = zlib.crc32(chunk, crc)
                out.write(chunk)
    finally:
        chunks.close()
    if written != entry.info.file_size or crc != entry.info.CRC:
        raise PackageRejected(f"entry {entry.name!r} does not match its size or CRC-32")
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
        raise PackageRejected("the package directory is not empty")
    root = str(dest)
    files = 0
    try:
        with (
            open(zip_path, "rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mm,
            zipfile.ZipFile(handle) as zf,
        ):
            entries = validate(zf, mm, size, limits)
            budget = limits.max_written
            made: set[str] = set()
            with memoryview(mm) as view:
                for entry in entries:
                    try:
                        _make_dirs(root, entry.name if entry.is_dir else _parent(entry.name), made)
                        if not entry.is_dir:
                            target = os.path.join(root, entry.name)
                            budget -= _write_entry(entry, view, zf, target, budget)
                            files += 1
                    except OSError as exc:  # its message would name the host path
                        raise PackageRejected(
                            f"entry {entry.name[:80]!r} could not be extracted: "
                            f"{exc.strerror or type(exc).__name__}"
                        ) from exc
    except PackageRejected:
        _empty(dest)
        raise
    except MALFORMED_ZIP_ERRORS as exc:
        _empty(dest)
        raise PackageRejected(f"package is not a valid zip: {_scrub(exc, root)}") from exc
    except NotImplementedError as exc:
        _empty(dest)
        raise PackageRejected(f"package uses an unsupported zip feature: {exc}") from exc
    except Exception as exc:  # a malformed package is the caller's error, never an internal one
        _empty(dest)
        raise PackageRejected(
            f"package could not be extracted: {type(exc).__name__}: {_scrub(exc, root)}"
        ) from exc
    return files


def _make_dirs(root: str, folder: str, made: set[str]) -> None:
    """Create ``folder`` (relative to ``root``) and its missing parents, top down, iteratively.

    ``made`` holds every directory created so far, so each is created exactly once and a
    parent is looked up, never re-walked from the root.
    """
    missing: list[str] = []
    while folder and folder not in made:
        missing.append(folder)
        folder = _parent(folder)
    for rel in reversed(missing):
        os.mkdir(os.path.join(root, rel))
        made.add(rel)


def _scrub(exc: BaseException, root: str) -> str:
    """The exception's text without the host path of the package directory."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc).replace(root, "<package dir>")


def _empty(directory: Path) -> None:
    for child in list(directory.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
