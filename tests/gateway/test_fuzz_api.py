"""Schemathesis over the OpenAPI document a running broker serves, over real HTTP, with every
check on: no server error, every answer's status, content type and body declared by the
document, every request the document allows accepted and every one it forbids refused, and
the stateful links (register a function, invoke it or submit a job, read the job, its logs,
cancel it) followed. Bounded in examples and time so it fits in ``make test``.

``test_a_broken_route_is_caught`` serves the same document from a broker one of whose routes
answers off its schema and another with a 500, and expects the same run to fail on both: the
clean run is not clean because nothing was checked.

The run is the schemathesis command line (``schemathesis run``) in a subprocess, its options
and ``schemathesis.toml`` written here; ``FIREPOOL_FUZZ_SEED`` replays another seed (the
default one is fixed, so that ``make test`` is repeatable)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from tests.conftest import deploy_examples
from tests.helpers import ThreadedBroker, threaded_broker

CATALOG = "budgets: {cpu: 8}\npools:\n  cpu: {min_count: 1, max_idle_count: 2, max_count: 4}\n"
SEED = int(os.environ.get("FIREPOOL_FUZZ_SEED", "20261204"))
MAX_TIME_S = 40
"""The fuzzing and stateful phases repeat until this is spent (the whole run: ~50 s here)."""
SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"

CONFIG = """\
# Every check on (set here, not by --checks, so that an operation below can turn one off).
[checks]
enabled = true

# Values the generator draws part of the time, so that requests reach a function and a
# package that exist instead of answering 404 (the rest of the time it invents them).
[dictionaries.functions]
values = ["noop"]
[dictionaries.packages]
values = ["{digest}"]

[parameters]
"path.name" = {{ dictionary = "functions", probability = 0.5 }}
"body.package_digest" = {{ dictionary = "packages", probability = 0.9 }}
"body.requirements" = {{ dictionary = "packages", probability = 0.2 }}
"path.sha256" = {{ dictionary = "packages", probability = 0.5 }}

# A package upload must hash to the digest in its path: JSON Schema cannot say so, so a body
# the schema allows is refused with 422 PackageRejected unless it happens to hash right.
[[operations]]
include-path = "/v1/packages/{{sha256}}"
include-method = "PUT"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "422"]

# The same Idempotency-Key with another body is refused with 422 IdempotencyMismatch: which
# keys were used is state the schema cannot hold.
[[operations]]
include-path-regex = "^/v1/functions/[^/]+(:invoke|/jobs)$"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "422"]

# A package past the size cap is refused 413 TooLarge, the status for a body too large,
# which the schema's maximum says; schemathesis expects schema violations to be 400s.
[[operations]]
include-path = "/v1/packages/{{sha256}}/uploads"
include-method = "POST"
checks.negative_data_rejection.expected-statuses = ["400", "401", "403", "404", "413", "422"]

# DELETE /v1/jobs/{{id}} cancels a job; its record stays readable (the cancel answers it as it
# stands, and its outcome is read afterwards), so reading it after the DELETE is no
# use-after-free.
[[operations]]
include-path-regex = "^/v1/jobs/"
checks.use_after_free.enabled = false
"""


def fuzz(
    url: str, token: str, workdir: Path, *only: str, max_time_s: int = MAX_TIME_S
) -> subprocess.CompletedProcess[str]:
    """``schemathesis run`` over ``url``'s ``/openapi.json`` with every check, as ``token``
    (admin), for at most about ``max_time_s``; ``only``: the paths to test, their ``GET``
    alone (all operations if none).
    ``workdir`` holds the config."""
    command = [
        str(SCHEMATHESIS),
        "run",
        f"{url}/openapi.json",
        "--header",
        f"Authorization: Bearer {token}",
        "--max-examples",
        "25",
        "--max-time",
        str(max_time_s),
        "--seed",
        str(SEED),
        # One worker: schemathesis runs workers as threads, and CPython 3.11 before 3.11.8
        # can fail ast.parse (which hypothesis calls to describe a filter) under concurrent
        # threads with "SystemError: AST constructor recursion depth mismatch" (gh-106905).
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--no-color",
    ]
    for path in only:
        command += ["--include-path", path]
    if only:
        command += ["--include-method", "GET"]
    return subprocess.run(
        command, cwd=workdir, capture_output=True, text=True, timeout=max_time_s + 120
    )


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    home = tmp_path_factory.mktemp("fuzz")
    server = start_broker(home, CATALOG, extra_env={"FIREPOOL_SYNC_WAIT_S": "2"})
    try:
        deploy_examples(server, {"noop": "noop:noop"})
        yield server
    finally:
        server.stop()
        kill_pods(home)


def _config(workdir: Path, digest: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "schemathesis.toml").write_text(CONFIG.format(digest=digest))
    return workdir


def test_the_served_api_passes_every_check(broker: BrokerServer, tmp_path: Path) -> None:
    admin = broker.token("fuzzer", Role.ADMIN)
    with broker.client("fuzzer", Role.ADMIN) as fp:
        digest = fp.describe_function("noop")["package_digest"]
    run = fuzz(broker.url, admin, _config(tmp_path, digest))
    report = run.stdout[-12000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    assert "API Links:" in run.stdout, "no stateful phase ran"
    assert broker.proc.poll() is None, "the broker died under the fuzzer"


class _OffSchemaJob:
    def to_public(self) -> dict[str, Any]:
        return {"id": 7}  # a job record without its required fields, its id not a string


@pytest.fixture
def broken_broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadedBroker]:
    """A broker on fake pods whose ``GET /v1/jobs`` answers a job off the schema and whose
    ``GET /v1/pools`` fails with a 500."""

    async def list_jobs(*args: object) -> list[_OffSchemaJob]:
        return [_OffSchemaJob()]

    def pool_report(**kwargs: object) -> dict[str, Any]:
        raise RuntimeError("a deliberately broken route")

    with threaded_broker(tmp_path / "home", backend="fake") as server:
        monkeypatch.setattr(server.broker, "list_jobs", list_jobs)
        monkeypatch.setattr(server.broker, "pool_report", pool_report)
        yield server


def test_a_broken_route_is_caught(broken_broker: ThreadedBroker, tmp_path: Path) -> None:
    admin = broken_broker.token("fuzzer", Role.ADMIN)
    config = _config(tmp_path, "0" * 64)
    run = fuzz(broken_broker.url, admin, config, "/v1/jobs", "/v1/pools", max_time_s=15)
    assert run.returncode != 0, run.stdout[-4000:]
    assert "GET /v1/jobs" in run.stdout and "Response violates schema" in run.stdout, run.stdout
    assert "GET /v1/pools" in run.stdout and "Server error" in run.stdout, run.stdout
