"""What a hop after submit could not carry is refused at submit, naming the field, and nothing
a caller sends can strand a job on a leased pod (found by fuzzing the API with schemathesis)."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest

from broker.executor import Outcome
from broker.retry_policy import decide
from functions.nesting import MAX_NESTING, ORJSON_MAX_DEPTH, nests_deeper
from functions.packaging import package_digest
from functions.sdk import ApiError, Client
from gateway.auth import Role
from pod_runtime import job_main
from tests.conftest import BEHAVIOURS, EXAMPLES
from tests.helpers import ThreadedBroker


def _nest(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


@pytest.fixture(scope="module")
def server(fake_pod_broker: ThreadedBroker) -> ThreadedBroker:
    """The shared broker (8-pod cpu ceiling) with a function that returns nested lists."""
    with fake_pod_broker.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="nested", sku="cpu", entrypoint="behaviours:nested")
    return fake_pod_broker


def _http(server: ThreadedBroker, role: Role = Role.INVOKE) -> httpx.Client:
    token = server.token("limits-user", role)
    return httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {token}"})


def test_the_job_runner_applies_the_same_nesting_limit_as_the_broker() -> None:
    assert (job_main.MAX_NESTING, job_main.ORJSON_MAX_DEPTH) == (MAX_NESTING, ORJSON_MAX_DEPTH)
    assert not nests_deeper(_nest(MAX_NESTING)) and nests_deeper(_nest(MAX_NESTING + 1))
    # The body's bracket count only ever settles "not deeper"; brackets inside strings
    # fall through to the exact check.
    shallow = {"text": "[" * 500}
    assert not nests_deeper(shallow, text=orjson.dumps({"input": shallow}))
    deep = _nest(MAX_NESTING + 1)
    assert nests_deeper(deep, text=orjson.dumps({"input": deep}))


def test_an_input_at_the_nesting_limit_runs_and_one_level_deeper_is_refused(
    server: ThreadedBroker,
) -> None:
    with _http(server) as http:
        ok = http.post("/v1/functions/noop:invoke", json={"input": _nest(MAX_NESTING)})
        assert ok.status_code == 200 and ok.json()["state"] == "SUCCEEDED", ok.text
        assert ok.json()["output"] == _nest(MAX_NESTING)
        for depth in (MAX_NESTING + 1, 254, 255, 1000):
            resp = http.post("/v1/functions/noop/jobs", content=_body(depth))
            assert resp.status_code == 400, (depth, resp.text)
            assert resp.json()["error"]["field"] == "input"


def _body(depth: int) -> bytes:
    return b'{"input":' + b"[" * depth + b"]" * depth + b"}"


def test_an_output_nested_too_deep_fails_the_job_and_keeps_the_pod(server: ThreadedBroker) -> None:
    with Client(server.url, server.token("deep-user", Role.INVOKE)) as fp:  # its own pods
        job = fp.invoke("nested", MAX_NESTING + 1, lease_tag="deep")
        assert job["state"] == "FAILED" and job["error"]["class"] == "FunctionError", job
        assert f"nests more than {MAX_NESTING} levels" in job["error"]["message"]
        again = fp.invoke("nested", 3, lease_tag="deep")
    assert again["state"] == "SUCCEEDED" and again["output"] == [[[]]]
    assert again["acquisition"]["path"] == "warm"  # the same pod, reset and reused


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"priority": 2**31}, "priority"),
        ({"priority": -(2**31) - 1}, "priority"),
        ({"lease_tag": "t" * 256}, "lease_tag"),
        ({"queue": "q" * 256}, "queue"),
    ],
)
def test_values_the_job_store_cannot_hold_are_refused(
    server: ThreadedBroker, body: dict[str, Any], field: str
) -> None:
    with _http(server) as http:
        resp = http.post("/v1/functions/noop/jobs", json=body)
    assert resp.status_code == 400 and resp.json()["error"]["field"] == field, resp.text


def test_an_integer_orjson_would_round_is_refused_and_a_64_bit_one_arrives_exact(
    server: ThreadedBroker,
) -> None:
    with _http(server) as http:
        ok = http.post("/v1/functions/noop:invoke", json={"input": {"id": 2**64 - 1}})
        wide = http.post("/v1/functions/noop/jobs", content=b'{"input": {"id": %d}}' % 2**64)
    assert ok.status_code == 200 and ok.json()["output"] == {"id": 2**64 - 1}, ok.text
    assert wide.status_code == 400 and "send it as a string" in wide.text, wide.text


def test_an_idempotency_key_longer_than_the_store_holds_is_refused(server: ThreadedBroker) -> None:
    with _http(server) as http:
        resp = http.post("/v1/functions/noop/jobs", json={}, headers={"Idempotency-Key": "k" * 256})
        fine = http.post("/v1/functions/noop/jobs", json={}, headers={"Idempotency-Key": "k" * 255})
    assert resp.status_code == 400 and resp.json()["error"]["field"] == "Idempotency-Key"
    assert fine.status_code in (200, 202)


def test_an_empty_idempotency_key_is_refused_not_matched_to_another_job(
    server: ThreadedBroker,
) -> None:
    """An empty key was stored without a body digest, so every later empty-key call, with
    any body and any function, answered that first job."""
    with _http(server) as http:
        empty = {"Idempotency-Key": ""}
        first = http.post("/v1/functions/noop:invoke", json={"input": "a"}, headers=empty)
        other = http.post("/v1/functions/nested:invoke", json={"input": 2}, headers=empty)
    for resp in (first, other):
        assert resp.status_code == 400 and resp.json()["error"]["field"] == "Idempotency-Key"
    # The SDK (and so the CLI) sent no key at all for an empty one, nor a state for an
    # empty --state: the call then went through unchecked (new-user run).
    with server.client("limits-user") as fp:
        with pytest.raises(ApiError) as no_key:
            fp.invoke("noop", "a", idempotency_key="")
        with pytest.raises(ApiError) as no_state:
            fp.jobs(state="")
    assert (no_key.value.status, no_key.value.field) == (400, "Idempotency-Key")
    assert (no_state.value.status, no_state.value.field) == (400, "state")


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/v1/jobs", {"limit": "0"}, "limit"),
        ("/v1/jobs", {"limit": "-1"}, "limit"),
        ("/v1/jobs", {"limit": "-9223372036854775809"}, "limit"),
        ("/v1/jobs", {"limit": "1001"}, "limit"),
        ("/v1/jobs", {"limit": "ten"}, "limit"),
        ("/v1/jobs", {"state": ""}, "state"),
        ("/v1/jobs", {"state": "DONE"}, "state"),
        ("/v1/pools", {"pods": "yes"}, "pods"),
        ("/v1/pools", {"pods": ""}, "pods"),
    ],
)
def test_a_query_value_outside_its_schema_is_refused_not_ignored(
    server: ThreadedBroker, path: str, params: dict[str, str], field: str
) -> None:
    with _http(server, Role.ADMIN) as http:
        resp = http.get(path, params=params)
    assert resp.status_code == 400 and resp.json()["error"]["field"] == field, resp.text


def test_the_edges_of_the_listing_limit_and_the_switches_are_accepted(
    server: ThreadedBroker,
) -> None:
    with _http(server, Role.ADMIN) as http:
        for params in ({"limit": "1"}, {"limit": "1000"}, {"state": "succeeded"}):
            assert http.get("/v1/jobs", params=params).status_code == 200, params
        for value in ("0", "1", "true", "false"):
            assert http.get("/v1/pools", params={"pods": value}).status_code == 200, value


def _noop_spec(server: ThreadedBroker) -> dict[str, Any]:
    """A registration body on the noop package, uploaded by this test's caller (only an
    uploader may register a function on a package)."""
    with server.client("limits-user", Role.DEPLOY) as fp:
        digest = fp.upload(package_digest(EXAMPLES / "noop")[1])
    return {"name": "bad", "sku": "cpu", "package_digest": digest}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"command": ["python3\u0000", "-c", "pass"]}, "command"),
        ({"entrypoint": "noop:noop", "env": {"A\u0000B": "1"}}, "env"),
        ({"entrypoint": "noop:noop", "env": {"A=B": "1"}}, "env"),
        ({"entrypoint": "noop:noop", "env": {"A": "x\u0000y"}}, "env"),
        # What the pod's agent would drop: stored, then silently missing from every job.
        ({"entrypoint": "noop:noop", "env": {"LD_PRELOAD": "/x.so"}}, "env"),
        ({"entrypoint": "noop:noop", "env": {"FIREPOOL_CALLER": "someone"}}, "env"),
        ({"entrypoint": "noop:noop", "env": {"BIG": "x" * 40_000}}, "env"),
        ({"entrypoint": "noop:noop", "env": {f"V{i}": "1" for i in range(257)}}, "env"),
        ({"entrypoint": "noop:noop", "pods": 9}, "pods"),
    ],
)
def test_a_function_no_pod_could_run_is_refused_at_registration(
    server: ThreadedBroker, extra: dict[str, Any], field: str
) -> None:
    body = {**_noop_spec(server), **extra}
    with _http(server, Role.DEPLOY) as http:
        resp = http.post("/v1/functions", json=body)
        assert resp.status_code == 400 and resp.json()["error"]["field"] == field, resp.text
        assert http.get("/v1/functions/bad").status_code == 404


def test_an_attempt_the_agent_refuses_fails_as_a_request_error_and_keeps_the_pod() -> None:
    """The broker's checks mirror the agent's, so an agent's 400 means they drifted apart:
    the job fails with the agent's typed error, is not retried, and the pod is not lost."""
    body = {"error": {"class": "InvalidRequest", "message": "command bad", "field": "command"}}
    outcome = Outcome.refused("p1", body)
    assert outcome.state == "failed" and outcome.lost_pods == []
    assert outcome.error == {"class": "InvalidRequest", "field": "command",
                             "message": "pod p1 refused the attempt: command bad"}  # fmt: skip
    assert not decide("InvalidRequest", ran_user_code=False, retries=0, max_retries=2).retry
    garbled = Outcome.refused("p1", "not json")
    assert garbled.error is not None and garbled.error["class"] == "InvalidRequest"
