"""Upload-time package checks: a package the agent would reject is refused at the door.

The pod agent validates again before extracting (it trusts nothing it fetched); this check only
makes a bad package fail loudly at deploy time instead of at its first job. It reuses the
agent's own validator so both sides apply exactly the same rules.
"""

from __future__ import annotations

import io
import zipfile

from functions.errors import PackageRejected
from pod_runtime.archive import ArchiveLimits, validate


def check_package(data: bytes, limits: ArchiveLimits | None = None) -> None:
    """Raise ``PackageRejected`` unless ``data`` is a zip the agent will extract."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            validate(zf, len(data), limits or ArchiveLimits())
    except zipfile.BadZipFile as exc:
        raise PackageRejected(f"not a zip archive: {exc}") from None
