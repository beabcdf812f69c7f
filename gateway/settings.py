"""Broker settings: one frozen dataclass, read once at startup from the environment/CLI.

No other module reads ``os.environ`` for configuration; they receive a ``Settings``.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from functions.errors import InvalidRequest

log = logging.getLogger("firepool.broker")


@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob of the broker process."""

    home: Path = Path(".firepool")
    """State directory: job store, signing key, packages, local pods, logs (FIREPOOL_HOME)."""
    host: str = "127.0.0.1"
    """Address the HTTP API binds to."""
    port: int = 8080
    """Port the HTTP API binds to."""
    store_url: str | None = None
    """SQLAlchemy URL of the job store (FIREPOOL_STORE_URL); default: SQLite in ``home``."""
    catalog_path: Path | None = None
    """YAML pool catalog (FIREPOOL_CATALOG); default: one CPU pool."""
    public_url: str | None = None
    """Base URL pods use to reach the gateway (signed package URLs); default http://host:port."""
    token_ttl_s: int = 30 * 86400
    """Lifetime of tokens minted by ``firepool token``."""
    token_cache_size: int = 4096
    """Validated tokens kept in memory (validation is skipped on a hit until the token expires)."""
    sync_wait_s: float = 60.0
    """Longest a sync invoke waits before answering 202 with the job id."""
    package_url_ttl_s: int = 900
    """Lifetime of the signed package URLs handed to pods."""
    dispatch_tick_s: float = 3.0
    """Fallback dispatcher tick; submit, release and pod-ready wake it immediately."""
    reconcile_s: float = 5.0
    """Scaler pass interval when nothing is queued (scale-down, floors, hold expiry)."""
    pod_ready_timeout_s: float = 60.0
    """A pod whose agent does not answer within this is deleted."""
    sandbox: bool | None = None
    """Run local pods under bubblewrap: None = when available, False = never."""
    result_retention_s: float = 7 * 86400.0
    """How long a finished job keeps its output and logs (FIREPOOL_RESULT_RETENTION_S); after
    it the job answers ``Expired``."""
    idempotency_retention_s: float = 86400.0
    """How long an Idempotency-Key deduplicates (FIREPOOL_IDEMPOTENCY_RETENTION_S)."""
    retention_sweep_s: float = 60.0
    """How often outputs past the store's result retention are expired (and logs deleted)."""
    gpu_sweep_s: float = 10.0
    """How often each GPU's exclusivity is re-verified (standby promotion needs it)."""
    lock_check_s: float = 30.0
    """How often the broker makes sure its home's and store's locks are still its own
    (``gateway.exclusive.BrokerLocks.check``; FIREPOOL_LOCK_CHECK_S, > 0). The checks also
    keep a MySQL lock's connection from idling out, so keep it well under the server's
    ``wait_timeout``."""
    drain_s: float = 10.0
    """On shutdown: stop intake, wait this long for running jobs, then cancel."""
    max_body_bytes: int = 512 * 1024 * 1024
    """Largest package upload accepted (the paper's 512 MiB compressed cap)."""
    max_json_bytes: int = 16 * 1024 * 1024
    """Largest JSON request body (an invoke's input included)."""
    audience: str = "firepool"
    """JWT ``aud`` required on every token."""

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{(self.home / 'jobs.db').resolve()}"

    @property
    def resolved_public_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        env = os.environ
        base = cls(
            home=Path(env.get("FIREPOOL_HOME", ".firepool")).resolve(),
            store_url=env.get("FIREPOOL_STORE_URL") or None,
            catalog_path=Path(env["FIREPOOL_CATALOG"]) if env.get("FIREPOOL_CATALOG") else None,
            public_url=env.get("FIREPOOL_PUBLIC_URL") or None,
            result_retention_s=_seconds_from(env, "FIREPOOL_RESULT_RETENTION_S", 7 * 86400.0),
            idempotency_retention_s=_seconds_from(env, "FIREPOOL_IDEMPOTENCY_RETENTION_S", 86400.0),
            retention_sweep_s=_seconds_from(env, "FIREPOOL_RETENTION_SWEEP_S", 60.0),
            lock_check_s=_seconds_from(env, "FIREPOOL_LOCK_CHECK_S", 30.0, positive=True),
        )
        return replace(base, **{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]


def _seconds_from(
    env: Mapping[str, str], name: str, default: float, positive: bool = False
) -> float:
    """``env[name]`` as a number of seconds >= 0 (``positive``: > 0 and finite, for an
    interval a loop sleeps) (``default`` when unset); ``InvalidRequest`` naming the variable
    otherwise (it was a ValueError traceback)."""
    text = env.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if positive and not 0 < value < math.inf:
        raise InvalidRequest(f"{name} must be a number of seconds > 0, not {text!r}", field=name)
    if not value >= 0:  # NaN fails too; inf means never
        raise InvalidRequest(f"{name} must be a number of seconds >= 0, not {text!r}", field=name)
    return value


def private_home(home: Path) -> None:
    """Create the state directory owner-only (0700): it holds the signing key, the job store,
    every package and log, and pod records. An existing one that others may enter is left as
    the operator made it, with a warning (any local user could read the job store's inputs
    and outputs and other callers' packages there)."""
    try:
        home.mkdir(mode=0o700, parents=True)
    except FileExistsError:  # made before (or by another process just now): check it below
        pass
    else:
        home.chmod(0o700)  # whatever the umask
        return
    mode = home.stat().st_mode
    if mode & 0o077:
        log.warning(
            "the state directory %s is open to other users (mode %o): it holds the signing key, "
            "the job store, packages and logs; chmod 700 it", home, mode & 0o777,
        )  # fmt: skip
