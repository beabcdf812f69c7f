"""``Settings.from_env``: every field of the broker has a variable, ``FIREPOOL_<FIELD>``, each
value is checked, and a bad one is refused naming its variable (in this process; the CLI's
one-line refusal of them is in ``test_cli_errors.py``)."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from broker.settings import Settings
from functions.errors import InvalidRequest

README = Path(__file__).resolve().parents[2] / "README.md"


def env_name(field: str) -> str:
    """The documented rule: ``FIREPOOL_<FIELD>``, but ``catalog_path`` keeps FIREPOOL_CATALOG."""
    return "FIREPOOL_CATALOG" if field == "catalog_path" else f"FIREPOOL_{field.upper()}"


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The process environment without any variable of a ``Settings`` field."""
    for spec in fields(Settings):
        monkeypatch.delenv(env_name(spec.name), raising=False)
    return monkeypatch


CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
SAMPLES = {
    "home": ("/srv/fp", Path("/srv/fp")),
    "host": ("0.0.0.0", "0.0.0.0"),
    "port": ("9001", 9001),
    "store_url": ("sqlite:////srv/fp/jobs.db", "sqlite:////srv/fp/jobs.db"),
    "catalog_path": ("/srv/catalog.yaml", Path("/srv/catalog.yaml")),
    "catalog_poll_s": ("0", 0.0),
    "public_url": ("https://gw.example:8443/fp", "https://gw.example:8443/fp"),
    "token_ttl_s": ("3600", 3600),
    "token_cache_size": ("16", 16),
    "sync_wait_s": ("0", 0.0),
    "package_url_ttl_s": ("120", 120),
    "package_store": ("memory", "memory"),
    "s3_bucket": ("fp-packages", "fp-packages"),
    "s3_endpoint_url": ("http://minio.storage:9000", "http://minio.storage:9000"),
    "s3_region": ("eu-west-1", "eu-west-1"),
    "s3_path_style": ("1", True),
    "s3_url_ttl_s": ("60", 60),
    "s3_part_bytes": ("8388608", 8388608),
    "dispatch_tick_s": ("0.5", 0.5),
    "reconcile_s": ("2", 2.0),
    "pod_ready_timeout_s": ("90", 90.0),
    "sandbox": ("false", False),
    "backend": ("fake", "fake"),
    "k8s_namespace": ("firepool", "firepool"),
    "k8s_create_qps": ("5.5", 5.5),
    "k8s_agent_port": ("9090", 9090),
    "k8s_rendezvous_port": ("29400", 29400),
    "k8s_kubeconfig": ("/srv/kubeconfig", Path("/srv/kubeconfig")),
    "k8s_gpu_resource": ("nvidia.com/vgpu", "nvidia.com/vgpu"),
    "k8s_gpu_memory_resource": ("hami.io/mem", "hami.io/mem"),
    "k8s_gpu_cores_resource": ("hami.io/cores", "hami.io/cores"),
    "k8s_standby_gpu_memory_mib": ("512", 512),
    "k8s_standby_gpu_cores": ("5", 5),
    "k8s_gpu_uuid_annotation": ("hami.io/use-gpuuuid", "hami.io/use-gpuuuid"),
    "allow_unsandboxed": ("1", True),
    "result_retention_s": ("inf", float("inf")),
    "idempotency_retention_s": ("0", 0.0),
    "retention_sweep_s": ("7.5", 7.5),
    "package_grace_s": ("inf", float("inf")),
    "storage_sweep_s": ("30", 30.0),
    "storage_quota_bytes": ("1000000", 1000000),
    "storage_quotas": ("alice=5, bob=0", (("alice", 5), ("bob", 0))),
    "gpu_sweep_s": ("20", 20.0),
    "lock_check_s": ("5", 5.0),
    "drain_s": ("0", 0.0),
    "max_body_bytes": ("1048576", 1048576),
    "max_json_bytes": ("65536", 65536),
    "audience": ("firepool-staging", "firepool-staging"),
    "jwks_url": ("https://kubernetes.default.svc/openid/v1/jwks",) * 2,
    "jwt_issuer": ("https://kubernetes.default.svc.cluster.local",) * 2,
    "jwt_audience": ("firepool-cluster", "firepool-cluster"),
    "jwt_caller_claim": ("email", "email"),
    "jwt_caller_prefix": ("oidc:", "oidc:"),
    "jwt_role_claim": ("groups", "groups"),
    "jwt_default_role": ("deploy", "deploy"),
    "jwks_timeout_s": ("2.5", 2.5),
    "jwks_cache_s": ("600", 600.0),
    "jwks_refresh_s": ("10", 10.0),
    "jwks_ca_file": (CA_FILE, Path(CA_FILE)),
    "jwks_token_file": ("/var/run/secrets/tokens/sa", Path("/var/run/secrets/tokens/sa")),
    "metrics": ("false", False),
    "log_format": ("json", "json"),
}
"""A value other than the default for every field, as its variable's text and as read."""


def test_every_field_is_read_from_its_variable(environ: pytest.MonkeyPatch) -> None:
    """13 of the 22 fields (sync_wait_s, drain_s, max_body_bytes, sandbox, ...) had no
    variable, flag or file: an operator could not set them without editing code."""
    assert set(SAMPLES) == {spec.name for spec in fields(Settings)}, "a field without a sample"
    for name, (text, _) in SAMPLES.items():
        environ.setenv(env_name(name), text)
    settings = Settings.from_env()
    unread = [name for name, (_, value) in SAMPLES.items() if getattr(settings, name) != value]
    assert not unread, unread
    assert all(getattr(Settings(), name) != value for name, (_, value) in SAMPLES.items())


def test_the_documented_names_keep_working_and_unset_means_the_default(
    environ: pytest.MonkeyPatch,
) -> None:
    assert Settings.from_env() == Settings(home=Path(".firepool").resolve())
    environ.setenv("FIREPOOL_HOME", "rel/home")
    environ.setenv("FIREPOOL_STORE_URL", "")
    environ.setenv("FIREPOOL_CATALOG", "")
    relative = Settings.from_env()
    assert relative.home == Path("rel/home").resolve()
    assert (relative.store_url, relative.catalog_path) == (None, None)
    for text, sandbox in (("auto", None), ("TRUE", True), ("1", True), ("0", False)):
        environ.setenv("FIREPOOL_SANDBOX", text)
        assert Settings.from_env().sandbox is sandbox, text


def test_flags_win_over_the_environment(environ: pytest.MonkeyPatch) -> None:
    environ.setenv("FIREPOOL_HOST", "0.0.0.0")
    environ.setenv("FIREPOOL_PORT", "9001")
    assert Settings.from_env(host="127.0.0.2", port=9100).port == 9100
    assert Settings.from_env(host="127.0.0.2", port=None).host == "127.0.0.2"
    assert Settings.from_env(host=None, port=None).port == 9001  # no flag: the variable


def test_every_variable_is_in_the_readme_configuration_table() -> None:
    """FIREPOOL_RETENTION_SWEEP_S was read but missing from the table."""
    section = README.read_text().split("## Configuration", 1)[1].split("\n## ", 1)[0]
    missing = [env_name(s.name) for s in fields(Settings) if f"`{env_name(s.name)}`" not in section]
    assert not missing, missing


@pytest.mark.parametrize(
    ("name", "text", "says"),
    [
        ("FIREPOOL_RETENTION_SWEEP_S", "0", "a number of seconds > 0"),  # 0 spun a core
        ("FIREPOOL_RETENTION_SWEEP_S", "inf", "a number of seconds > 0"),
        ("FIREPOOL_LOCK_CHECK_S", "nan", "a number of seconds > 0"),
        ("FIREPOOL_DISPATCH_TICK_S", "0", "a number of seconds > 0"),
        ("FIREPOOL_RECONCILE_S", "-1", "a number of seconds > 0"),
        ("FIREPOOL_GPU_SWEEP_S", "0", "a number of seconds > 0"),
        ("FIREPOOL_POD_READY_TIMEOUT_S", "0", "a number of seconds > 0"),
        ("FIREPOOL_SYNC_WAIT_S", "inf", "a finite number of seconds >= 0"),
        ("FIREPOOL_DRAIN_S", "-0.5", "a finite number of seconds >= 0"),
        ("FIREPOOL_RESULT_RETENTION_S", "abc", "a number of seconds >= 0"),
        ("FIREPOOL_IDEMPOTENCY_RETENTION_S", "nan", "a number of seconds >= 0"),
        ("FIREPOOL_MAX_JSON_BYTES", "0", "a whole number > 0"),
        ("FIREPOOL_MAX_BODY_BYTES", "1e9", "a whole number > 0"),
        ("FIREPOOL_TOKEN_TTL_S", "-5", "a whole number > 0"),
        ("FIREPOOL_TOKEN_CACHE_SIZE", "0", "a whole number > 0"),
        ("FIREPOOL_PACKAGE_URL_TTL_S", "1.5", "a whole number > 0"),
        ("FIREPOOL_S3_PART_BYTES", "1048576", "a byte count in [5 MiB, 5 GiB]"),
        ("FIREPOOL_S3_ENDPOINT_URL", "minio:9000", "an http:// or https:// URL with a host"),
        ("FIREPOOL_PORT", "70000", "a port (1-65535)"),
        ("FIREPOOL_SANDBOX", "yes", "1, true, 0, false or auto"),
        ("FIREPOOL_BACKEND", "k8s", "one of local, fake"),
        ("FIREPOOL_LOG_FORMAT", "yaml", "one of text, json"),
        ("FIREPOOL_METRICS", "on", "1, true, 0 or false"),
        ("FIREPOOL_AUDIENCE", "", "a non-empty string"),
        ("FIREPOOL_HOST", " ", "a non-empty string"),
        ("FIREPOOL_JWKS_URL", "kubernetes.default.svc", "an http:// or https:// URL with a host"),
        ("FIREPOOL_JWT_DEFAULT_ROLE", "root", "one of invoke, deploy, admin"),
        ("FIREPOOL_JWT_CALLER_CLAIM", "", "a non-empty string"),
        ("FIREPOOL_JWKS_REFRESH_S", "0", "a number of seconds > 0"),
        ("FIREPOOL_JWKS_TIMEOUT_S", "inf", "a number of seconds > 0"),
        ("FIREPOOL_HOME", "", "a non-empty string"),
        ("FIREPOOL_PUBLIC_URL", "ftp://x", "an http:// or https:// URL with a host"),
        ("FIREPOOL_PUBLIC_URL", "localhost:8080", "an http:// or https:// URL with a host"),
        ("FIREPOOL_PUBLIC_URL", "http://", "an http:// or https:// URL with a host"),
        ("FIREPOOL_PUBLIC_URL", "http://h:port", "an http:// or https:// URL with a host"),
        ("FIREPOOL_STORE_URL", "bogus", "is not a database URL"),
        ("FIREPOOL_STORE_URL", "postgresql://x@h/x", "unsupported job store backend"),
        ("FIREPOOL_STORE_URL", "mysql+nodriver://x@h/x", "no driver for 'mysql+nodriver'"),
        ("FIREPOOL_STORE_URL", "sqlite:///:memory:", "an in-memory SQLite database"),
        ("FIREPOOL_STORE_URL", "sqlite://", "an in-memory SQLite database"),
        ("FIREPOOL_STORE_URL", "sqlite:///file::memory:?uri=true", "an in-memory SQLite"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(
    name: str, text: str, says: str, environ: pytest.MonkeyPatch
) -> None:
    """Each was accepted (and broke the broker later: a spinning sweep, every job failing
    ``PackageRejected``), ended in a traceback, or had no variable."""
    environ.setenv(name, text)
    with pytest.raises(InvalidRequest) as refused:
        Settings.from_env()
    assert refused.value.field == name
    assert refused.value.message.startswith(name) and says in refused.value.message
