"""/openapi.json is a valid OpenAPI 3.1 document that declares every route, path parameter
and request field the broker has, with the limits it enforces: what a client generator or a
fuzzer reads must be what the broker accepts (schemathesis could test only the routes without
parameters against the old schema, and sent bodies the broker refused)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from openapi_spec_validator import validate
from starlette.routing import Mount, Route

from broker.service import Broker
from broker.settings import Settings
from gateway.app import FUNCTION_FIELDS, INVOKE_FIELDS, OPENAPI, create_app, served_openapi
from gateway.auth import Role
from tests.conftest import BEHAVIOURS
from tests.helpers import ThreadedBroker

INTERNAL = {"/openapi.json", "/dashboard"}  # the schema itself; the HTML dashboard


def _body(path: str, method: str = "post", document: dict[str, Any] = OPENAPI) -> dict[str, Any]:
    """The JSON body schema of ``method path``, with the components its references name."""
    schema = document["paths"][path][method]["requestBody"]["content"]["application/json"]
    return {**schema["schema"], "components": document["components"]}


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(OPENAPI)


def test_every_public_route_and_method_is_declared(tmp_path: Path) -> None:
    app = create_app(Broker(Settings(home=tmp_path)))
    declared = {
        (re.sub(r"\{[^}]+\}", "{}", path), method.upper())
        for path, ops in OPENAPI["paths"].items()
        for method in ops
        if method != "parameters"
    }
    for route in app.routes:
        if isinstance(route, Mount) and route.path in INTERNAL:
            continue  # the dashboard's pages (docs/dashboard.md), HTML for admins, not the API
        assert isinstance(route, Route)
        if route.path in INTERNAL:
            continue
        template = re.sub(r"\{[^}]+\}", "{}", route.path)
        for method in route.methods or {"GET"}:
            if method == "HEAD" and "GET" in (route.methods or {"GET"}):
                continue  # Starlette answers HEAD for every GET
            assert (template, method) in declared, (route.path, method)


def test_every_path_parameter_is_declared() -> None:
    for path, ops in OPENAPI["paths"].items():
        names = set(re.findall(r"\{([^}]+)\}", path))
        declared = {p["name"] for p in ops.get("parameters", []) if p["in"] == "path"}
        assert names == declared, path


def test_the_request_bodies_are_the_decoded_fields_and_refuse_unknown_ones() -> None:
    for path, fields in (("/v1/functions/{name}/jobs", INVOKE_FIELDS),
                         ("/v1/functions/{name}:invoke", INVOKE_FIELDS),
                         ("/v1/functions", FUNCTION_FIELDS)):  # fmt: skip
        schema = _body(path)
        assert set(schema["properties"]) == set(fields)
        assert set(schema.get("required", [])) == {n for n, f in fields.items() if f.required}
        assert schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("body", "valid"),
    [
        ({"input": {"x": [1, 2]}, "lease_tag": "s1", "priority": 5}, True),
        ({"timeout_s": 86400}, True),
        ({"lease_tga": "s1"}, False),
        ({"priority": 2**31}, False),
        ({"priority": "high"}, False),
        ({"lease_tag": "t" * 256}, False),
        ({"timeout_s": 0}, False),
        ({"timeout_s": 86401}, False),
        ({"input": [2**64 - 1, -(2**63), 0.5, "x" * 30, None, {"a": True}]}, True),
        ({"input": {"a": [2**64]}}, False),
        ({"input": -(2**63) - 1}, False),
    ],
)
def test_the_invoke_schema_holds_the_limits_the_broker_enforces(
    body: dict[str, Any], valid: bool
) -> None:
    validator = jsonschema.Draft202012Validator(_body("/v1/functions/{name}/jobs"))
    assert validator.is_valid(body) is valid


def test_a_function_names_exactly_one_of_entrypoint_and_command() -> None:
    validator = jsonschema.Draft202012Validator(_body("/v1/functions"))
    base = {"name": "f", "sku": "cpu", "package_digest": "0" * 64}
    assert validator.is_valid({**base, "entrypoint": "m:f"})
    assert validator.is_valid({**base, "command": ["python3", "-c", "pass"]})
    assert validator.is_valid({**base, "entrypoint": "m:f", "command": None})
    assert not validator.is_valid({**base, "entrypoint": "m:f", "command": ["x"]})
    assert not validator.is_valid(base)


@pytest.mark.parametrize(
    ("env", "valid"),
    [
        ({"HF_TOKEN": "x", "PYTHONUNBUFFERED": "1"}, True),
        ({"LD_PRELOAD": "x"}, False),
        ({"FIREPOOL_JOB_ID": "x"}, False),
        ({"PYTHONPATH": "x"}, False),
        ({"PYTHONFOO": "x"}, False),
        ({"1X": "x"}, False),
        ({"A": "a\0b"}, False),
        ({f"V{i}": "x" for i in range(257)}, False),
    ],
)
def test_a_function_env_is_what_registration_accepts(env: dict[str, str], valid: bool) -> None:
    validator = jsonschema.Draft202012Validator(_body("/v1/functions"))
    body = {"name": "f", "sku": "cpu", "package_digest": "0" * 64, "entrypoint": "m:f"}
    assert validator.is_valid({**body, "env": env}) is valid


def test_the_served_document_names_the_pools_and_their_largest_gangs(tmp_path: Path) -> None:
    """A sku outside the catalog, or more pods than its pool can ever hold, is refused by
    registration; the document a broker serves says so for its own catalog."""
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("budgets: {cpu: 6}\npools:\n  cpu: {max_count: 4}\n  big: {max_count: 9}\n")
    app = create_app(Broker(Settings(home=tmp_path, catalog_path=catalog)))
    document = served_openapi(app)
    validator = jsonschema.Draft202012Validator(_body("/v1/functions", document=document))
    body = {"name": "f", "package_digest": "0" * 64, "entrypoint": "m:f"}
    assert validator.is_valid({**body, "sku": "cpu", "pods": 4})
    assert validator.is_valid({**body, "sku": "big", "pods": 6})
    assert not validator.is_valid({**body, "sku": "cpu", "pods": 5})
    assert not validator.is_valid({**body, "sku": "big", "pods": 7})  # the cpu budget: 6
    assert not validator.is_valid({**body, "sku": "gpu"})
    assert "enum" not in _body("/v1/functions")["properties"]["sku"], "OPENAPI is unchanged"


def test_a_405_names_the_methods_the_path_has(fake_pod_broker: ThreadedBroker) -> None:
    with httpx.Client(base_url=fake_pod_broker.url) as http:
        listing = http.request("OPTIONS", "/v1/functions")
        invoke = http.put("/v1/functions/noop:invoke")
    assert listing.status_code == 405 and {"GET", "POST"} <= _allow(listing)
    assert invoke.status_code == 405 and _allow(invoke) == {"POST"}


def _allow(resp: httpx.Response) -> set[str]:
    return {m.strip() for m in resp.headers["allow"].split(",")}


def test_both_answers_of_a_package_upload_are_declared() -> None:
    """201 for the first upload of a digest, 200 (``created`` false) for every later one."""
    responses = OPENAPI["paths"]["/v1/packages/{sha256}"]["put"]["responses"]
    assert {"200", "201"} <= set(responses)
    assert responses["200"]["content"] == responses["201"]["content"]


def test_a_405_and_an_unknown_route_answer_in_the_error_form(
    fake_pod_broker: ThreadedBroker,
) -> None:
    """Both were ``text/plain`` ("Method Not Allowed"), outside the declared Error schema."""
    with httpx.Client(base_url=fake_pod_broker.url) as http:
        wrong = http.put("/v1/functions/noop:invoke")
        nowhere = http.get("/v1/nowhere")
    for resp, cls in ((wrong, "InvalidRequest"), (nowhere, "NotFound")):
        jsonschema.validate(resp.json(), OPENAPI["components"]["schemas"]["Error"])
        assert resp.json()["error"]["class"] == cls, resp.text


def test_job_records_match_the_declared_job_schema(fake_pod_broker: ThreadedBroker) -> None:
    """The job record was declared ``{"type": "object"}``: none of its fields."""
    schema = {**OPENAPI["components"]["schemas"]["Job"], "components": OPENAPI["components"]}
    with fake_pod_broker.client("schema-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="schema-boom", sku="cpu", entrypoint="behaviours:fail")
    with fake_pod_broker.client("schema-user") as fp:
        ok = fp.invoke("noop", {"x": 1}, lease_tag="s")
        failed = fp.invoke("schema-boom", "x", lease_tag="s")
        listed = fp.jobs()
        cancelled = fp.cancel(ok["id"])
    for record in (ok, failed, cancelled, *listed):
        jsonschema.validate(record, schema)
    assert failed["error"]["class"] == "FunctionError" and "traceback" in failed["error"]


@pytest.mark.parametrize(
    ("path", "name"),
    [("/v1/jobs?stat=RUNNING", "stat"), ("/v1/jobs?limit=1&limt=1", "limt"),
     ("/v1/functions?x=1", "x"), ("/v1/jobs/abc/logs?folow=1", "folow"),
     ("/healthz?x=1", "x"), ("/metrics?x=1", "x"), ("/openapi.json?x=1", "x")],
)  # fmt: skip
def test_an_unknown_query_parameter_is_refused_by_name(
    fake_pod_broker: ThreadedBroker, path: str, name: str
) -> None:
    """``GET /v1/jobs?stat=RUNNING&limt=1`` listed every job, the typos ignored."""
    token = fake_pod_broker.token("query-typo")
    with httpx.Client(base_url=fake_pod_broker.url) as http:
        resp = http.get(path, headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"] == {
        "class": "UnknownField",
        "message": resp.json()["error"]["message"],
        "field": name,
    }


def test_the_bearer_scheme_is_matched_in_any_case(fake_pod_broker: ThreadedBroker) -> None:
    """RFC 7235: ``bearer`` and ``BEARER`` are the scheme too (they were 401)."""
    token = fake_pod_broker.token("scheme-case")
    with httpx.Client(base_url=fake_pod_broker.url) as http:
        answers = [
            http.get("/v1/jobs", headers={"Authorization": f"{scheme} {token}"}).status_code
            for scheme in ("Bearer", "bearer", "BEARER")
        ]
    assert answers == [200, 200, 200]


def test_head_is_declared_where_the_server_answers_it(fake_pod_broker: ThreadedBroker) -> None:
    """Starlette answers HEAD for every GET; the document declared it for none of them."""
    token = fake_pod_broker.token("head-reader")
    with httpx.Client(base_url=fake_pod_broker.url) as http:
        for path in ("/healthz", "/metrics", "/v1/jobs"):
            resp = http.head(path, headers={"Authorization": f"Bearer {token}"})
            assert resp.status_code == 200 and "200" in OPENAPI["paths"][path]["head"]["responses"]
    gets = {path for path, ops in OPENAPI["paths"].items() if "get" in ops}
    assert gets <= {path for path, ops in OPENAPI["paths"].items() if "head" in ops}


def test_probes_declare_their_400_and_logs_are_bytes(fake_pod_broker: ThreadedBroker) -> None:
    """The probes answered 400 to a query parameter the document did not declare, and logs
    (any bytes a job wrote) were declared and served as text (new-user run)."""
    for path in ("/healthz", "/readyz", "/metrics"):
        assert "400" in OPENAPI["paths"][path]["get"]["responses"], path
        assert httpx.get(f"{fake_pod_broker.url}{path}?x=1").status_code == 400
    logs = OPENAPI["paths"]["/v1/jobs/{id}/logs"]["get"]["responses"]["200"]["content"]
    assert list(logs) == ["application/octet-stream"]
    with fake_pod_broker.client("logs-type") as fp:
        job = fp.invoke("noop", {})
        answer = fp.logs(job["id"])
    assert answer.headers["content-type"] == "application/octet-stream"
