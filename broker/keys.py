"""The broker's signing key: one 32-byte secret in the state directory (``signing.key``).

It signs callers' tokens (``gateway.auth``) and, through a derived key, the package URLs pods
fetch. Only the broker (``firepool serve``) creates it; everything else only reads it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from broker.settings import private_home


def load_key(path: Path) -> bytes:
    """Read the signing key the broker made (``load_or_create_key``); ``FileNotFoundError``
    if there is none. What mints tokens outside the broker (``firepool token``) uses this:
    a key it made itself would sign tokens the broker, on another home, refuses."""
    return bytes.fromhex(path.read_text().strip())


def load_or_create_key(path: Path) -> bytes:
    """Read the signing key, creating it (0600, in a private state directory) on first use;
    only the broker (``firepool serve``) creates it. Processes creating it at once agree on
    one key: each writes its own temporary file and links it into place, the first link wins
    and the others read the winner's key."""
    try:
        return load_key(path)
    except FileNotFoundError:
        pass
    private_home(path.parent)
    key = secrets.token_bytes(32)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key.hex())
        try:
            os.link(tmp, path)
        except FileExistsError:  # another process linked its key first: use that one
            return load_key(path)
        return key
    finally:
        tmp.unlink(missing_ok=True)
