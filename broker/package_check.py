"""Upload-time package checks: a package the agent would reject is refused at the door.

The pod agent validates again before extracting (it trusts nothing it fetched); this check only
makes a bad package fail loudly at deploy time instead of at its first job. It reuses the
agent's own validator and limits (names: length, component length and depth; entries and the
directories they imply; declared sizes and compression ratios), so both sides apply exactly the
same rules; only extraction itself (the real bytes and CRCs) is left to the pod.
"""

from __future__ import annotations

import mmap
import zipfile
from pathlib import Path

from functions.errors import PackageRejected
from pod_runtime.archive import MALFORMED_ZIP_ERRORS, ArchiveLimits, validate


def check_package_file(path: Path, limits: ArchiveLimits | None = None) -> None:
    """Raise ``PackageRejected`` unless ``path`` is a zip the agent will extract.

    Whatever goes wrong while reading the archive is the package's fault and is reported as
    ``PackageRejected``; a message never names ``path`` (a host path of the package store).
    """
    with path.open("rb") as f:
        size = path.stat().st_size
        if size == 0:
            raise PackageRejected("not a zip archive: the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                with zipfile.ZipFile(f) as zf:
                    validate(zf, mm, size, limits or ArchiveLimits())
            except PackageRejected:
                raise
            except MALFORMED_ZIP_ERRORS as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise PackageRejected(f"not a valid zip archive: {reason}") from None
            except NotImplementedError as exc:
                raise PackageRejected(f"package uses an unsupported zip feature: {exc}") from None
            except Exception as exc:  # a malformed archive is the caller's error, not ours
                raise PackageRejected(
                    f"not a valid zip archive: {type(exc).__name__}: {exc}"
                ) from None
