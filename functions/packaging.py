"""Deterministic packaging: the same tree always gives the same zip bytes and sha256.

Entries are sorted by their POSIX path, every timestamp is 1980-01-01 00:00, modes are 0644
(0755 when the owner-execute bit is set), and caches (``__pycache__``, ``*.pyc``, VCS folders)
are left out. Symlinks are refused: a package is plain files only.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import zipfile
from collections.abc import Iterator
from pathlib import Path

from functions.errors import PackageRejected

FIXED_DATE = (1980, 1, 1, 0, 0, 0)
SKIP_DIRS = frozenset({"__pycache__", ".git", ".hg", ".svn", ".venv", ".mypy_cache", ".firepool"})
SKIP_SUFFIXES = (".pyc", ".pyo")
MAX_PACKAGE_BYTES = 512 * 1024 * 1024


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _walk(root: Path) -> Iterator[Path]:
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            if not name.endswith(SKIP_SUFFIXES):
                yield Path(dirpath) / name


def build_package(root: Path) -> bytes:
    """Zip the files below ``root`` deterministically and return the archive bytes."""
    if not root.is_dir():
        raise PackageRejected(f"{root} is not a directory")
    files = sorted(_walk(root), key=lambda p: p.relative_to(root).as_posix())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=6) as zf:
        for path in files:
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
                raise PackageRejected(f"{path} is not a regular file (links are not packaged)")
            name = path.relative_to(root).as_posix()
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:  # bytes that are not UTF-8 (surrogate-escaped)
                raise PackageRejected(
                    f"{name.encode('utf-8', 'surrogateescape')!r} is not a UTF-8 file name; "
                    "a package's names are UTF-8"
                ) from None
            info = zipfile.ZipInfo(name, date_time=FIXED_DATE)
            mode = 0o755 if st.st_mode & stat.S_IXUSR else 0o644
            info.external_attr = (stat.S_IFREG | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so the mode bits are honoured everywhere
            zf.writestr(info, path.read_bytes())
    data = buf.getvalue()
    if len(data) > MAX_PACKAGE_BYTES:
        raise PackageRejected(f"package is {len(data)} bytes; the cap is {MAX_PACKAGE_BYTES}")
    return data


def package_digest(root: Path) -> tuple[str, bytes]:
    """Build the package for ``root``; return ``(sha256 hex, zip bytes)``."""
    data = build_package(root)
    return sha256_hex(data), data
