"""Deterministic packaging: the same tree always gives the same zip bytes and sha256.

Entries are sorted by their POSIX path, every timestamp is 1980-01-01 00:00, modes are 0644
(0755 when the owner-execute bit is set), and caches (``__pycache__``, ``*.pyc``, VCS folders)
are left out, and so is what the root's ``.firepoolignore`` names (gitignore patterns,
``pathspec``) and the deploy's own files there (``firepool.toml``, ``.firepoolignore``: a
change of deploy settings is not a change of code). Symlinks are refused: a package is plain
files only.

Files are streamed into the archive, never read whole. ``package_file`` writes the archive to
an anonymous temporary file (under ``TMPDIR``), so a deploy holds one chunk of it in memory at
a time however big the package; ``build_package`` returns the bytes (the zip, capped at
``MAX_PACKAGE_BYTES``, is then held once). The caps the pod applies to what
it extracts (documented in docs/pod_runtime.md) are checked before the first byte is read, from
the files' sizes, and the compressed size as it grows, so an oversized tree fails at once with
``PackageRejected`` instead of after it was read and compressed.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import stat
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pathspec

from functions.errors import PackageRejected

FIXED_DATE = (1980, 1, 1, 0, 0, 0)
SKIP_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".venv", ".mypy_cache", ".firepool"})
SKIP_SUFFIXES = (".pyc", ".pyo")
MAX_PACKAGE_BYTES = 512 * 1024 * 1024
"""The zip itself (the gateway's upload cap and the pod's download cap)."""
MAX_UNPACKED_BYTES = 2_000_000_000
"""Bytes the files hold together: what the pod writes when it extracts them (its 2 GB cap)."""
MAX_FILES = 100_000
"""Files in one package (the pod's entry cap); the directories they imply have the same cap."""
MAX_NAME_BYTES = 1024
"""UTF-8 bytes in one file's path below the root (the pod's name cap)."""
MAX_DEPTH = 64
"""Components in one file's path below the root (the pod's depth cap)."""
CHUNK = 1 << 20
IGNORE_FILE = ".firepoolignore"
DEPLOY_FILES = frozenset({"firepool.toml", IGNORE_FILE})
"""Files at a package's root that configure its deploy and are never packaged."""
Advance = Callable[[int], None]
"""A progress callback: ``advance(n)`` after ``n`` more bytes were packed or sent."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ignore_spec(root: Path) -> pathspec.PathSpec | None:
    """The patterns of ``root/.firepoolignore`` (gitignore's syntax), or None without one."""
    path = root / IGNORE_FILE
    if not path.is_file():
        return None
    return pathspec.GitIgnoreSpec.from_lines(path.read_text(encoding="utf-8").splitlines())


def _walk(root: Path) -> Iterator[Path]:
    ignored = ignore_spec(root)
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath).relative_to(root).as_posix()
        prefix = "" if here == "." else f"{here}/"
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d not in SKIP_DIRS and not (ignored and ignored.match_file(f"{prefix}{d}/"))
        )
        for name in filenames:
            if name.endswith(SKIP_SUFFIXES) or (not prefix and name in DEPLOY_FILES):
                continue
            if ignored is None or not ignored.match_file(f"{prefix}{name}"):
                yield Path(dirpath) / name


def _members(root: Path) -> list[tuple[Path, str, os.stat_result]]:
    """(path, entry name, lstat) of every file to package, sorted by name, checked against the
    pod's caps on names, files, directories and bytes without reading any file."""
    members: list[tuple[Path, str, os.stat_result]] = []
    folders: set[str] = set()
    total = 0
    for path in sorted(_walk(root), key=lambda p: p.relative_to(root).as_posix()):
        if len(members) == MAX_FILES:
            raise PackageRejected(f"{root} holds more than {MAX_FILES} files (the cap)")
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
            raise PackageRejected(f"{path} is not a regular file (links are not packaged)")
        name = path.relative_to(root).as_posix()
        try:
            encoded = name.encode("utf-8")
        except UnicodeEncodeError:  # bytes that are not UTF-8 (surrogate-escaped)
            raise PackageRejected(
                f"{name.encode('utf-8', 'surrogateescape')!r} is not a UTF-8 file name; "
                "a package's names are UTF-8"
            ) from None
        if len(encoded) > MAX_NAME_BYTES or name.count("/") >= MAX_DEPTH:
            raise PackageRejected(
                f"{name[:80]!r}... is too long or too deep for a package "
                f"(caps: {MAX_NAME_BYTES} bytes, {MAX_DEPTH} levels)"
            )
        folder = name.rpartition("/")[0]
        while folder and folder not in folders:
            folders.add(folder)
            folder = folder.rpartition("/")[0]
        if len(folders) > MAX_FILES:
            raise PackageRejected(f"{root} holds more than {MAX_FILES} directories (the cap)")
        total += st.st_size
        if total > MAX_UNPACKED_BYTES:
            raise PackageRejected(
                f"the files below {root} hold more than {MAX_UNPACKED_BYTES} bytes "
                f"(reached at {name[:80]!r}); a package unpacks to at most that"
            )
        members.append((path, name, st))
    return members


def _too_big(size: int) -> PackageRejected:
    return PackageRejected(f"package is at least {size} bytes; the cap is {MAX_PACKAGE_BYTES}")


def write_package(root: Path, dst: BinaryIO, progress: Advance | None = None) -> int:
    """Zip the files below ``root`` deterministically into ``dst`` (seekable, empty, at
    offset 0) and return the archive's size. ``progress(n)``: after each chunk of ``n``
    bytes of the files was packed.

    Raises ``PackageRejected`` for a link or special file, a name that is not UTF-8, more than
    ``MAX_FILES`` files or ``MAX_UNPACKED_BYTES`` bytes (both before any file is read), or a zip
    over ``MAX_PACKAGE_BYTES`` (as soon as the archive being written passes it).
    """
    if not root.is_dir():
        raise PackageRejected(f"{root} is not a directory")
    members = _members(root)
    with zipfile.ZipFile(dst, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for path, name, st in members:
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE)
            mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the mode bits are honoured everywhere
            info.file_size = st.st_size  # as writestr would set it: picks zip64 the same way
            with path.open("rb") as src, zf.open(info, "w") as out:
                while chunk := src.read(CHUNK):
                    out.write(chunk)
                    if progress is not None:
                        progress(len(chunk))
                    if dst.tell() > MAX_PACKAGE_BYTES:
                        raise _too_big(dst.tell())
    size = dst.tell()
    if size > MAX_PACKAGE_BYTES:
        raise _too_big(size)
    return size


def build_package(root: Path) -> bytes:
    """The package for ``root`` as bytes (``write_package``'s archive and refusals)."""
    buf = io.BytesIO()
    write_package(root, buf)
    return buf.getvalue()


def package_digest(root: Path) -> tuple[str, bytes]:
    """Build the package for ``root``; return ``(sha256 hex, zip bytes)``."""
    data = build_package(root)
    return sha256_hex(data), data


@dataclass(frozen=True, slots=True)
class PackageFile:
    """A package written to a temporary file (``package_file``)."""

    digest: str
    """sha256 hex of the archive."""
    size: int
    """The archive's bytes."""
    file: BinaryIO
    """The archive, open for reading at offset 0; closed (and gone) when the block ends."""

    def chunks(self) -> Iterator[bytes]:
        """The archive from its start, ``CHUNK`` bytes at a time."""
        self.file.seek(0)
        while chunk := self.file.read(CHUNK):
            yield chunk


@contextlib.contextmanager
def package_file(root: Path, progress: Advance | None = None) -> Iterator[PackageFile]:
    """Build the package for ``root`` into an anonymous temporary file and yield it with its
    digest and size; memory holds one chunk at a time, whatever the package's size.

    The digest is taken by reading the file back once it is complete: zipfile rewrites each
    member's header after its data, so the bytes are final only then (and still in the page
    cache). Same bytes and digest as ``build_package``; same refusals as ``write_package``.
    """
    with tempfile.TemporaryFile(prefix="firepool-package-") as f:
        size = write_package(root, f, progress)
        f.seek(0)
        digest = hashlib.sha256()
        while chunk := f.read(CHUNK):
            digest.update(chunk)
        f.seek(0)
        yield PackageFile(digest.hexdigest(), size, f)
