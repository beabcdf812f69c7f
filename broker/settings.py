"""Broker settings: one frozen dataclass, read once at startup from the environment/CLI.

No other module reads ``os.environ`` for configuration; they receive a ``Settings``. Every
field is read from one variable, ``FIREPOOL_<FIELD>`` (``env_name``; ``catalog_path`` keeps
its documented ``FIREPOOL_CATALOG``), checked by the parser its type names: an ``Annotated``
field carries its own (``Interval``, ``Seconds``, ``Count``, ...), the plain types share
``_PARSERS``. A bad value is refused at start-up with ``InvalidRequest`` naming the variable
(the CLI prints one ``error:`` line and exits 2), never accepted and found out later.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Annotated, Any, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from functions.errors import InvalidRequest
from functions.stores import PACKAGE_STORES, S3Config
from pool_manager.backends.factory import BACKEND_KINDS

log = logging.getLogger("firepool.broker")

Parse = Callable[[str, str], Any]
"""How ``Settings.from_env`` reads one variable: ``(its name, its text)`` to the field's
value, or ``InvalidRequest`` naming the variable."""


def _refuse(name: str, what: str, text: str) -> InvalidRequest:
    return InvalidRequest(f"{name} must be {what}, not {text!r}", field=name)


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan  # refused below like NaN itself


def _seconds(name: str, text: str) -> float:
    """Seconds >= 0; ``inf`` means forever (a retention)."""
    value = _float(text)
    if not value >= 0:  # NaN fails too
        raise _refuse(name, "a number of seconds >= 0", text)
    return value


def _finite_seconds(name: str, text: str) -> float:
    """Seconds >= 0 and finite, where 0 means "not at all" (no sync wait, no drain)."""
    value = _float(text)
    if not 0 <= value < math.inf:
        raise _refuse(name, "a finite number of seconds >= 0", text)
    return value


def _interval(name: str, text: str) -> float:
    """Seconds > 0 and finite: a loop sleeps this long between passes, or waits this long for
    something (0 would make an idle broker spin a core)."""
    value = _float(text)
    if not 0 < value < math.inf:
        raise _refuse(name, "a number of seconds > 0", text)
    return value


def _whole(name: str, text: str, low: int, high: float, what: str) -> int:
    """A whole number in [low, high]; else ``InvalidRequest`` saying it must be ``what``."""
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise _refuse(name, what, text)
    return value


def _count(name: str, text: str) -> int:
    """A whole number > 0: a size, a capacity, a lifetime in whole seconds."""
    return _whole(name, text, 1, math.inf, "a whole number > 0")


def _port(name: str, text: str) -> int:
    """A TCP port (a larger number wrapped around in the socket call)."""
    return _whole(name, text, 1, 65535, "a port (1-65535)")


def _rate(name: str, text: str) -> float:
    """Operations per second: > 0 and finite."""
    value = _float(text)
    if not 0 < value < math.inf:
        raise _refuse(name, "a number of operations per second > 0", text)
    return value


def _dns_label(name: str, text: str) -> str:
    """A Kubernetes namespace name: 1-63 of a-z, 0-9 and '-', a letter or digit at each end."""
    if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?", text):
        raise _refuse(name, "a namespace name (1-63 of a-z, 0-9 and '-')", text)
    return text


def _text(name: str, text: str) -> str:
    if not text.strip():
        raise _refuse(name, "a non-empty string", text)
    return text


def _path(name: str, text: str) -> Path:
    return Path(_text(name, text))


def _optional_path(name: str, text: str) -> Path | None:
    """Empty: unset (the default)."""
    return Path(text) if text else None


def _optional_text(name: str, text: str) -> str | None:
    """Empty: unset (the default)."""
    return text or None


_FLAGS = {"1": True, "true": True, "0": False, "false": False}


def _flag(name: str, text: str) -> bool:
    value = _FLAGS.get(text.strip().lower())
    if value is None:
        raise _refuse(name, "1, true, 0 or false", text)
    return value


def _flag_or_auto(name: str, text: str) -> bool | None:
    """``auto``: None, the field's "decide at run time" (``sandbox``: when available)."""
    if text.strip().lower() == "auto":
        return None
    if text.strip().lower() not in _FLAGS:
        raise _refuse(name, "1, true, 0, false or auto", text)
    return _flag(name, text)


def _http_url(name: str, text: str) -> str | None:
    """Empty: unset. Else an http:// or https:// URL with a host and no query: pods fetch
    packages below it, and any other would be accepted and then fail every job
    ``PackageRejected``."""
    if not text:
        return None
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (a bad port raises ValueError)
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
        raise _refuse(name, "an http:// or https:// URL with a host (what pods reach)", text)
    return text


def _store_url(name: str, text: str) -> str | None:
    """Empty: unset (SQLite in the home). Else a URL ``broker.store`` opens: SQLite or MySQL
    with an installed driver, and never an in-memory database (a broker's store must outlive
    it; the store's lock would even leave a file named ``:memory:`` in the working
    directory). Each is refused here with a clear error instead of a traceback at start. The
    URL is not echoed: it may hold a password."""
    if not text:
        return None
    # Imported here: only a broker configured for another store pays for SQLAlchemy.
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from broker.store.engine import backend_of, sqlite_file

    try:
        url = make_url(text)
    except (ArgumentError, ValueError):
        raise InvalidRequest(
            f"{name} is not a database URL (sqlite:///PATH or mysql+pymysql://USER@HOST/DB)",
            field=name,
        ) from None
    try:
        backend = backend_of(url)
        url.get_dialect().import_dbapi()
    except ValueError as exc:
        raise InvalidRequest(f"{name}: {exc}", field=name) from None
    except (ArgumentError, ImportError) as exc:
        raise InvalidRequest(
            f"{name}: no driver for {url.drivername!r} here ({exc}); use mysql+pymysql://",
            field=name,
        ) from None
    memory = url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    if backend == "sqlite" and (memory or sqlite_file(url).name == ":memory:"):
        raise InvalidRequest(
            f"{name} names an in-memory SQLite database: the job store must be a file "
            "(it outlives the broker); use sqlite:///PATH",
            field=name,
        )
    return text


def _jwks_url(name: str, text: str) -> str | None:
    """Empty: unset. Else an http:// or https:// URL with a host (where the keys are)."""
    if not text:
        return None
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (a bad port raises ValueError)
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _refuse(name, "an http:// or https:// URL with a host", text)
    return text


JWT_ROLES = ("invoke", "deploy", "admin")
"""The roles a token may carry (``gateway.auth.Role``'s values, lowest first)."""


def _role(name: str, text: str) -> str:
    """One of ``JWT_ROLES``."""
    if text not in JWT_ROLES:
        raise _refuse(name, f"one of {', '.join(JWT_ROLES)}", text)
    return text


LOG_FORMATS = ("text", "json")
"""``firepool serve``'s log line formats (``gateway.log_format``)."""


def _log_format(name: str, text: str) -> str:
    """One of ``LOG_FORMATS``."""
    if text not in LOG_FORMATS:
        raise _refuse(name, f"one of {', '.join(LOG_FORMATS)}", text)
    return text


def _storage_quotas(name: str, text: str) -> tuple[tuple[str, int], ...]:
    """Empty: none. Else ``CALLER=BYTES`` pairs separated by commas, each caller once and
    each quota a whole number >= 0 (0: the caller may store nothing)."""
    quotas: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        caller, sep, size = item.rpartition("=")
        caller = caller.strip()
        if not sep or not caller or caller in quotas:
            raise _refuse(name, "CALLER=BYTES pairs separated by commas, each caller once", text)
        quotas[caller] = _whole(name, size.strip(), 0, math.inf, "CALLER=BYTES with BYTES >= 0")
    return tuple(quotas.items())


def _package_store(name: str, text: str) -> str:
    """One of the stores ``functions.stores.open_package_store`` builds."""
    if text not in PACKAGE_STORES:
        raise _refuse(name, f"one of {', '.join(PACKAGE_STORES)}", text)
    return text


def _part_bytes(name: str, text: str) -> int:
    """A multipart upload's part size: at least S3's 5 MiB."""
    return _whole(name, text, 5 * 1024 * 1024, 5 * 1024**3, "a byte count in [5 MiB, 5 GiB]")


def _backend(name: str, text: str) -> str:
    """One of the pod backends ``pool_manager.backends.factory.make_backend`` builds."""
    if text not in BACKEND_KINDS:
        raise _refuse(name, f"one of {', '.join(BACKEND_KINDS)}", text)
    return text


Interval = Annotated[float, _interval]
"""Seconds a loop sleeps between passes, or a timeout: finite and > 0."""
Seconds = Annotated[float, _finite_seconds]
"""Seconds where 0 means "not at all": finite and >= 0."""
Retention = Annotated[float, _seconds]
"""How long something is kept: >= 0, ``inf`` forever."""
Count = Annotated[int, _count]
"""A size, capacity or whole-second lifetime: > 0."""
Port = Annotated[int, _port]
"""A TCP port, 1-65535."""
Rate = Annotated[float, _rate]
"""Operations per second: finite and > 0."""

_PARSERS: dict[object, Parse] = {
    str: _text,
    Path: _path,
    str | None: _optional_text,
    Path | None: _optional_path,
    bool: _flag,
    bool | None: _flag_or_auto,
}
"""The parser of each plain field type; an ``Annotated`` field's is its metadata."""
_ENV_NAMES = {"catalog_path": "FIREPOOL_CATALOG"}
"""Fields whose variable is not ``FIREPOOL_<FIELD>`` (documented before the rule)."""


def env_name(field: str) -> str:
    """The environment variable a ``Settings`` field is read from."""
    return _ENV_NAMES.get(field, f"FIREPOOL_{field.upper()}")


def parser_of(hint: object) -> Parse:
    """The parser of a field whose (evaluated) type is ``hint``; KeyError for a type with none
    (a new field needs one: ``tests/gateway/test_settings_env.py`` checks every field)."""
    if get_origin(hint) is Annotated:
        return get_args(hint)[1]
    return _PARSERS[hint]


@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob of the broker process; each field is read from ``env_name(field)``
    (``FIREPOOL_<FIELD>``) by ``from_env``, and its type says what it accepts."""

    home: Path = Path(".firepool")
    """State directory: job store, signing key, packages, local pods, logs (FIREPOOL_HOME)."""
    host: str = "127.0.0.1"
    """Address the HTTP API binds to (``--host`` wins over FIREPOOL_HOST)."""
    port: Port = 8080
    """Port the HTTP API binds to (``--port`` wins over FIREPOOL_PORT)."""
    store_url: Annotated[str | None, _store_url] = None
    """SQLAlchemy URL of the job store (FIREPOOL_STORE_URL); default: SQLite in ``home``."""
    catalog_path: Path | None = None
    """YAML pool catalog (FIREPOOL_CATALOG); default: one CPU pool."""
    catalog_poll_s: Seconds = 5.0
    """How often the catalog file is read for a change, reloaded without a restart when its
    content changed (a mounted ConfigMap's update); 0: only on SIGHUP."""
    public_url: Annotated[str | None, _http_url] = None
    """Base URL pods use to reach the gateway (signed package URLs); default http://host:port."""
    token_ttl_s: Count = 30 * 86400
    """Lifetime of tokens minted by ``firepool token``."""
    token_cache_size: Count = 4096
    """Validated tokens kept in memory (validation is skipped on a hit until the token expires)."""
    sync_wait_s: Seconds = 60.0
    """Longest a sync invoke waits before answering 202 with the job id (0: at once)."""
    package_url_ttl_s: Count = 900
    """Lifetime of the signed package URLs handed to pods."""
    package_store: Annotated[str, _package_store] = "local"
    """Where uploaded packages are kept (FIREPOOL_PACKAGE_STORE): ``local``, files under
    ``home/packages``; ``memory``, this process's memory, lost when it stops (fast tests,
    demos); pods fetch either through the broker's signed ``/v1/blobs`` URLs. ``s3``, a
    bucket (``s3_*`` below; credentials from the standard AWS chain): pods fetch presigned
    URLs of the object store, clients upload to it directly, and finished attempts' logs
    are kept there too (README, "Packages in S3")."""
    s3_bucket: str | None = None
    """The bucket of the ``s3`` package store (FIREPOOL_S3_BUCKET); it must exist."""
    s3_endpoint_url: Annotated[str | None, _http_url] = None
    """An S3-compatible server's URL (FIREPOOL_S3_ENDPOINT_URL; MinIO, SeaweedFS...); unset:
    AWS S3. Pods and clients reach this same URL: it must be one they can resolve."""
    s3_region: str | None = None
    """The bucket's region (FIREPOOL_S3_REGION); unset: the AWS chain's, else us-east-1."""
    s3_path_style: bool = False
    """Address the bucket as ``endpoint/bucket/key`` (FIREPOOL_S3_PATH_STYLE; most
    self-hosted servers need it) rather than ``bucket.endpoint/key``."""
    s3_url_ttl_s: Count = 300
    """Lifetime of the presigned URLs the s3 store hands out (FIREPOOL_S3_URL_TTL_S): a pod's
    package GET, a client's upload PUTs (an upload begun in time may run past it)."""
    s3_part_bytes: Annotated[int, _part_bytes] = 64 * 1024 * 1024
    """An upload larger than this goes to the bucket in parts of this size
    (FIREPOOL_S3_PART_BYTES; at least S3's 5 MiB)."""
    dispatch_tick_s: Interval = 3.0
    """Fallback dispatcher tick; submit, release and pod-ready wake it immediately."""
    reconcile_s: Interval = 5.0
    """Scaler pass interval when nothing is queued (scale-down, floors, hold expiry)."""
    pod_ready_timeout_s: Interval = 60.0
    """A pod whose agent does not answer within this is deleted."""
    backend: Annotated[str, _backend] = "local"
    """What pods are (FIREPOOL_BACKEND): ``local``, a ``pod_runtime`` agent process per pod on
    this machine; ``kubernetes``, a Kubernetes pod per pod, from its pool's ``template``
    (docs/kubernetes.md); ``fake``, in-memory pods that run attempts inside the broker's
    process, with no isolation (fast tests only: ``pool_manager/backends/fake.py`` lists what
    it does not emulate)."""
    k8s_namespace: Annotated[str, _dns_label] = "default"
    """The namespace the kubernetes backend makes its pods and their Secrets in
    (FIREPOOL_K8S_NAMESPACE)."""
    k8s_create_qps: Rate = 20.0
    """Most pod creates per second the kubernetes backend sends the API server (each pod is
    two requests: its Secret and itself); creates beyond it wait their turn
    (FIREPOOL_K8S_CREATE_QPS)."""
    k8s_agent_port: Port = 8090
    """The port every pod's agent listens on, reached at the pod's IP (FIREPOOL_K8S_AGENT_PORT)."""
    k8s_rendezvous_port: Port = 29500
    """The port declared on every pod that a gang's rank 0 job listens on at its pod IP for
    its ranks' rendezvous (``MASTER_PORT``; FIREPOOL_K8S_RENDEZVOUS_PORT). Local pods get a
    free port per gang instead."""
    k8s_kubeconfig: Path | None = None
    """A kubeconfig file for the kubernetes backend (FIREPOOL_K8S_KUBECONFIG); unset: the
    in-cluster service account's configuration."""
    k8s_gpu_resource: str = "nvidia.com/gpu"
    """The resource a GPU pod asks for cards by (FIREPOOL_K8S_GPU_RESOURCE); with HAMi, a
    virtual card: a share of one (docs/kubernetes.md, GPUs)."""
    k8s_gpu_memory_resource: str = "nvidia.com/gpumem"
    """The resource a standby asks for its share's memory by, in MiB
    (FIREPOOL_K8S_GPU_MEMORY_RESOURCE)."""
    k8s_gpu_cores_resource: str = "nvidia.com/gpucores"
    """The resource a standby asks for its share's compute by, in percent of the card
    (FIREPOOL_K8S_GPU_CORES_RESOURCE)."""
    k8s_standby_gpu_memory_mib: Count = 256
    """A standby's memory share in MiB: a cap it never uses, as it allocates nothing
    (FIREPOOL_K8S_STANDBY_GPU_MEMORY_MIB)."""
    k8s_standby_gpu_cores: Count = 1
    """A standby's compute share, percent of the card (FIREPOOL_K8S_STANDBY_GPU_CORES)."""
    k8s_gpu_uuid_annotation: str = "nvidia.com/use-gpuuuid"
    """The scheduler's annotation that pins a standby to its active's card by UUID
    (FIREPOOL_K8S_GPU_UUID_ANNOTATION; HAMi's)."""
    sandbox: bool | None = None
    """Run local pods under bubblewrap: None = when available (``auto``), False = never."""
    allow_unsandboxed: bool = False
    """Let ``firepool serve`` start when local pods cannot be sandboxed (no working bubblewrap,
    or ``sandbox`` off; FIREPOOL_ALLOW_UNSANDBOXED, ``serve --allow-unsandboxed``). Every job
    then runs as the broker's user and can read its signing key (and so mint admin tokens) and
    its job store: only where every caller may act as that user. Without it such a broker
    refuses to start (``broker.pod_isolation.check_pod_isolation``)."""
    result_retention_s: Retention = 7 * 86400.0
    """How long a finished job keeps its output and logs (FIREPOOL_RESULT_RETENTION_S); after
    it the job answers ``Expired``."""
    idempotency_retention_s: Retention = 86400.0
    """How long an Idempotency-Key deduplicates (FIREPOOL_IDEMPOTENCY_RETENTION_S)."""
    retention_sweep_s: Interval = 60.0
    """How often outputs past the store's result retention are expired (and logs deleted)."""
    package_grace_s: Retention = 86400.0
    """How long a package that no function version references stays stored
    (FIREPOOL_PACKAGE_GRACE_S), counted from the latest of: when its bytes were stored, when
    anyone last uploaded them, and when the last version naming it was deleted; an upload
    authorised but not finished keeps it too. ``inf``: packages are never collected. A
    package a function version (or a job still to run) names is never collected
    (``broker.storage_collection``, docs/storage.md)."""
    storage_sweep_s: Interval = 3600.0
    """How often packages past their grace period are collected and job logs past result
    retention deleted (FIREPOOL_STORAGE_SWEEP_S)."""
    storage_quota_bytes: Count = 10 * 1024**3
    """Bytes of packages each caller may keep stored (FIREPOOL_STORAGE_QUOTA_BYTES): an
    upload that would take it past is refused with ``QuotaExceeded`` (413). Every package a
    caller uploaded counts in full, also one another caller uploaded too (``broker.quotas``)."""
    storage_quotas: Annotated[tuple[tuple[str, int], ...], _storage_quotas] = ()
    """Per-caller quotas in bytes that replace ``storage_quota_bytes`` for those callers
    (FIREPOOL_STORAGE_QUOTAS=``alice=1073741824,bob=0``; 0: may store nothing)."""
    gpu_sweep_s: Interval = 10.0
    """How often each GPU's exclusivity is re-verified (standby promotion needs it)."""
    lock_check_s: Interval = 30.0
    """How often the broker makes sure its home's and store's locks are still its own
    (``broker.exclusive.BrokerLocks.check``; FIREPOOL_LOCK_CHECK_S). The checks also keep
    a MySQL lock's connection from idling out, so keep it well under the server's
    ``wait_timeout``."""
    drain_s: Seconds = 10.0
    """On shutdown, how long the requests in flight, then the running jobs, may finish
    (each). A job still running then is not cancelled: it runs on in its pod, and the next
    start takes it up (README, "What happens to jobs")."""
    max_body_bytes: Count = 512 * 1024 * 1024
    """Largest package upload accepted (the paper's 512 MiB compressed cap)."""
    max_json_bytes: Count = 16 * 1024 * 1024
    """Largest JSON request body (an invoke's input included)."""
    audience: str = "firepool"
    """JWT ``aud`` required on every token the broker mints and checks."""
    jwks_url: Annotated[str | None, _jwks_url] = None
    """Also accept RS256/ES256 tokens signed by a key published at this JWKS URL
    (FIREPOOL_JWKS_URL): the cluster's service-account issuer, a company's OIDC
    (README, "Callers identified by the cluster"). Unset: only the broker's own
    tokens. Needs ``jwt_issuer``."""
    jwt_issuer: str | None = None
    """The ``iss`` every JWKS token must carry (FIREPOOL_JWT_ISSUER)."""
    jwt_audience: str | None = None
    """The ``aud`` every JWKS token must carry (FIREPOOL_JWT_AUDIENCE); unset: ``audience``."""
    jwt_caller_claim: str = "sub"
    """The JWKS token claim that names the caller (FIREPOOL_JWT_CALLER_CLAIM); a non-empty
    string in every token, else it is refused."""
    jwt_caller_prefix: str = ""
    """Put before every JWKS token's caller (FIREPOOL_JWT_CALLER_PREFIX), e.g. ``oidc:``, so
    that no outside subject is the same caller as a name ``firepool token`` mints. Empty (the
    default): an outside ``alice`` and a minted ``alice`` are one caller, sharing jobs, holds
    and quota, as a move from minted tokens to an identity provider wants."""
    jwt_role_claim: str | None = None
    """The JWKS token claim that names the caller's role (FIREPOOL_JWT_ROLE_CLAIM): a role,
    or a list (``groups``) whose highest role counts. Unset, or absent from a token:
    ``jwt_default_role``."""
    jwt_default_role: Annotated[str, _role] = "invoke"
    """The role of a JWKS token that names none (FIREPOOL_JWT_DEFAULT_ROLE): invoke, deploy
    or admin."""
    jwks_timeout_s: Interval = 5.0
    """Longest one fetch of the JWKS may take (FIREPOOL_JWKS_TIMEOUT_S)."""
    jwks_cache_s: Interval = 300.0
    """How long a fetched JWKS is used before it is fetched again (FIREPOOL_JWKS_CACHE_S)."""
    jwks_refresh_s: Interval = 30.0
    """Least time between fetches made for a key id the JWKS lacks, or after a failed fetch
    (FIREPOOL_JWKS_REFRESH_S): a rotated key is found within it; forged tokens cannot make
    the broker fetch more often, and while the JWKS is down its tokens get 503 with
    ``Retry-After``."""
    jwks_ca_file: Path | None = None
    """CA bundle for an https JWKS URL (FIREPOOL_JWKS_CA_FILE; in a cluster, the service
    account's ``ca.crt``); unset: the system's CAs."""
    jwks_token_file: Path | None = None
    """A file whose text is sent as a bearer token with each JWKS fetch, read again each time
    (FIREPOOL_JWKS_TOKEN_FILE; in a cluster, the broker's own service-account ``token``: the
    API server serves its JWKS to service accounts); unset: none is sent."""
    metrics: bool = True
    """Record the broker's event metrics (FIREPOOL_METRICS): acquisitions, start latencies,
    creates, deletes, resets, store commits, HTTP requests (``broker.telemetry``). Off, those
    cost nothing and ``/metrics`` serves only the state gauges read at scrape time (pods,
    queues, budgets, held capacity); ``benchmarks.dashboard`` measures the cost A/B."""
    log_format: Annotated[str, _log_format] = "text"
    """``firepool serve``'s log lines (FIREPOOL_LOG_FORMAT, ``--log-format``): ``text``, one
    readable line per event, or ``json``, one JSON object per line with the event's fields
    (docs/observability.md)."""

    def __post_init__(self) -> None:
        if self.jwks_url is not None and self.jwt_issuer is None:
            raise InvalidRequest(
                "FIREPOOL_JWT_ISSUER must be set with FIREPOOL_JWKS_URL: a JWKS token is "
                "accepted only from the issuer it names",
                field="FIREPOOL_JWT_ISSUER",
            )

    @property
    def resolved_store_url(self) -> str:
        return self.store_url or f"sqlite:///{(self.home / 'jobs.db').resolve()}"

    @property
    def resolved_public_url(self) -> str:
        return self.public_url or f"http://{self.host}:{self.port}"

    @property
    def s3_config(self) -> S3Config | None:
        """The ``s3`` store's bucket and how to reach it; None without a bucket."""
        if self.s3_bucket is None:
            return None
        return S3Config(
            bucket=self.s3_bucket, endpoint_url=self.s3_endpoint_url, region=self.s3_region,
            path_style=self.s3_path_style, url_ttl_s=self.s3_url_ttl_s,
            part_bytes=self.s3_part_bytes,
        )  # fmt: skip

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Each field from its variable (``env_name``) checked by its parser (``parser_of``),
        else its default; ``overrides`` that are not None (command-line flags) win over both.
        ``home`` comes back absolute. ``InvalidRequest`` naming the first bad variable."""
        env = os.environ
        hints = get_type_hints(cls, include_extras=True)
        values: dict[str, object] = {}
        for spec in fields(cls):
            name = env_name(spec.name)
            if name in env:
                values[spec.name] = parser_of(hints[spec.name])(name, env[name])
        values.update((k, v) for k, v in overrides.items() if v is not None)
        settings = cls(**values)  # type: ignore[arg-type]
        return replace(settings, home=settings.home.resolve())


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
