"""``firepool serve --log-format json``: one JSON object per line with the event's fields
(job id, attempt id, caller, pool, event), and no secret in either format: no token, no
signed URL's signature, no password, whatever a log line is handed."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import Role
from gateway.harness import REPO, BrokerServer, kill_pods, start_broker
from gateway.log_format import REDACTED, Redact, formatter, redact
from tests.conftest import EXAMPLES

CATALOG = "pools:\n  cpu: {min_count: 0, max_count: 2}\n"
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlLWJ5dGVz"
SECRETS = {
    "a bearer header": (f"Authorization: Bearer {JWT}", JWT),
    "a bare token": (f"token {JWT} refused", JWT),
    "a signed URL": ("GET /v1/blobs/ab12?exp=17&sig=deadbeefcafe HTTP/1.1", "deadbeefcafe"),
    "a password in a URL": ("store mysql+pymysql://fp:hunter2@db/fp down", "hunter2"),
}


@pytest.fixture(scope="module")
def json_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    home = tmp_path_factory.mktemp("jsonlog")
    server = start_broker(home, CATALOG, extra_env={"FIREPOOL_LOG_FORMAT": "json"})
    try:
        yield server
    finally:
        server.stop()
        kill_pods(home)


def json_lines(server: BrokerServer) -> list[dict[str, Any]]:
    """Every line of the broker's log as JSON (one that is not fails the test)."""
    return [json.loads(line) for line in server.log().splitlines() if line.strip()]


def test_a_json_log_has_each_jobs_events_with_their_fields(json_broker: BrokerServer) -> None:
    with json_broker.client("dev", Role.DEPLOY) as fp:
        fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop")
    token = json_broker.token("alice")
    with json_broker.client("alice") as fp:
        job = fp.invoke("noop", 1, lease_tag="t")
    deadline = time.monotonic() + 10  # the access line is written once the answer is sent
    while True:
        lines = json_lines(json_broker)
        if any(line.get("event") == "http_request" and line["caller"] == "alice" for line in lines):
            break
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    mine = {line["event"]: line for line in lines if line.get("job_id") == job["id"]}
    assert set(mine) >= {"job_queued", "attempt_started", "job_ended"}
    started = mine["attempt_started"]
    assert started["attempt_id"] == job["attempts"][0]["id"]
    assert (started["caller"], started["pool"]) == ("alice", "cpu")
    assert started["path"] == job["acquisition"]["path"]
    assert mine["job_ended"]["state"] == "SUCCEEDED"
    requests = [line for line in lines if line.get("event") == "http_request"]
    assert any(r["caller"] == "alice" and r["status"] == 200 for r in requests)
    blobs = [r for r in requests if r["path"].startswith("/v1/blobs/")]
    assert blobs, "the pod fetched its package"  # its signed URL's query is never logged
    text = json_broker.log()
    assert token not in text and "sig=" not in text and "&exp=" not in text


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("case", sorted(SECRETS))
def test_no_secret_reaches_either_format(fmt: str, case: str) -> None:
    message, secret = SECRETS[case]
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(Redact())
    logger = logging.getLogger(f"firepool.test.{fmt}")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("seen: %s", message, extra={"event": "x", "api_token": secret})
        logger.warning("in a field", extra={"event": "y", "detail": message})
        try:
            raise RuntimeError(message)
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    written = out.getvalue()
    assert secret not in written
    # text: the message and the traceback; JSON: the extra fields too
    assert written.count(REDACTED) >= (4 if fmt == "json" else 2)
    if fmt == "json":
        records = [json.loads(line) for line in written.splitlines() if line.startswith("{")]
        assert [r["event"] for r in records[:2]] == ["x", "y"]
        assert records[0]["api_token"] == REDACTED and "traceback" in records[2]


def test_redact_keeps_what_is_not_a_secret() -> None:
    line = "job 01ab started: attempt 01ab:0 on cpu-1f2e, path warm (caller alice)"
    assert redact(line) == line
    assert redact("GET /v1/jobs/01ab?follow=1") == "GET /v1/jobs/01ab?follow=1"


def test_serve_refuses_an_unknown_log_format(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--log-format", "yaml"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"FIREPOOL_HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        timeout=60,
    )
    assert run.returncode == 2 and "--log-format" in run.stderr and "yaml" in run.stderr
