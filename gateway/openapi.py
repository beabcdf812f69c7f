"""The API schema served at /openapi.json.

Request bodies are generated from the same ``Field`` maps ``app.py`` decodes with (names,
types, required, defaults; unknown fields are refused, so ``additionalProperties: false``),
plus the ranges ``app.check_invoke`` and ``FunctionSpec.validate`` enforce, so a client
generator or a fuzzer sends what the broker accepts. The routes are few and stable; the
summaries are written here. ``tests/gateway/test_openapi.py`` checks every route and path
parameter is declared and the document is valid OpenAPI 3.1.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

from functions.packaging import MAX_PACKAGE_BYTES
from functions.spec import DIGEST_RE, ENTRYPOINT_RE, NAME_RE
from gateway.decoding import INTEGER_RANGE, Field
from pod_runtime.jobenv import (
    DENY_NAMES,
    DENY_PREFIXES,
    MAX_USER_VARS,
    MAX_VALUE,
    PYTHON_ALLOWED,
    SYSTEM_NAMES,
)
from pod_runtime.jobenv import (
    NAME_RE as ENV_NAME_RE,
)
from pool_manager.catalog import Catalog, PoolSpec
from pool_manager.model import PATH_ORDER
from pool_manager.states import JobState

_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    dict: "object",
    list: "array",
}
_ERROR = {"$ref": "#/components/schemas/Error"}
_RETRY_AFTER = {
    "description": "whole seconds to wait before sending the same request again",
    "schema": {"type": "integer", "minimum": 1},
}
_NO_NUL = {"pattern": "^[^\\u0000]*$"}
"""A string without NUL (an argument or environment value of a process cannot hold one)."""
_JOB = {"$ref": "#/components/schemas/Job"}
_OBJECT = {"type": "object"}
_NUMBER_OR_NULL = {"type": ["number", "null"]}
_ERROR_DETAIL = {
    "type": "object",
    "required": ["class", "message"],
    "properties": {
        "class": {"type": "string", "description": "an error class (functions.errors)"},
        "message": {"type": "string"},
        "field": {"type": "string", "description": "the request field at fault"},
        "type": {"type": "string", "description": "FunctionError: the exception's type"},
        "traceback": {"type": "string", "description": "FunctionError: its last lines"},
    },
}
"""What ``error`` holds, in an error body and in a job record (more keys may follow)."""


JSON_VALUE = {"$ref": "#/components/schemas/JsonValue"}


def json_value_schema() -> dict[str, Any]:
    """Any JSON value whose integers lie in ``decoding.INTEGER_RANGE`` (a wider integer
    literal is refused: it would reach the function as a float, its low digits lost).
    Recursive, through ``JSON_VALUE``; the nesting limit is in the field's description.
    JSON Schema compares values, not how they are written, so a float beyond that range
    (``1e300``, which the broker takes) is left out too: the schema is the narrower."""
    low, high = INTEGER_RANGE
    return {
        "anyOf": [
            {"type": ["null", "boolean", "string"]},
            {"type": "number", "not": {"type": "integer"}},
            {"type": "integer", "minimum": low, "maximum": high},
            {"type": "array", "items": JSON_VALUE},
            {"type": "object", "additionalProperties": JSON_VALUE},
        ]
    }


def with_pools(document: Mapping[str, Any], catalog: Catalog) -> dict[str, Any]:
    """``document`` as one broker serves it, with what registration checks against its
    catalog: a function's ``sku`` is one of its pools, and its ``pods`` at most that pool's
    ``largest_gang``; its ``resources`` fit some pool (``resources_fit``). A deep copy:
    ``document`` is left as it is."""
    largest_gangs = {sku: catalog.largest_gang(sku) for sku in catalog.pools}
    served = copy.deepcopy(dict(document))
    body = served["paths"]["/v1/functions"]["post"]["requestBody"]["content"]
    schema = body["application/json"]["schema"]
    schema["properties"]["sku"]["enum"] = sorted(largest_gangs)
    schema["properties"]["resources"]["anyOf"] = [
        {"type": "null"},
        *(resources_fit(pool) for _, pool in sorted(catalog.pools.items())),
    ]
    schema["allOf"] = [
        *schema.get("allOf", ()),
        {
            "anyOf": [
                {"properties": {"sku": {"const": sku}, "pods": {"maximum": most}}}
                for sku, most in sorted(largest_gangs.items())
            ]
        },
    ]
    return served


def resources_fit(pool: PoolSpec) -> dict[str, Any]:
    """The ``resources`` that ``pool`` holds, as ``Catalog.smallest_fit`` judges: a CPU
    request of at most its cores (a CPU pool), or a GPU request (GPUs or a GPU accelerator
    asked) of at most its GPUs on its accelerator (a GPU pool); memory within its limit."""
    props: dict[str, Any] = {}
    if pool.memory_limit_mb is not None:
        props["memory"] = {"maximum": pool.memory_limit_mb}
    if not pool.is_gpu:
        props |= {
            "cpu": {"maximum": pool.units_per_pod},
            "gpus": {"maximum": 0},
            "accelerator": {"const": "cpu"},
        }
        return {"properties": props}
    props |= {"gpus": {"maximum": pool.units_per_pod}, "accelerator": {"const": pool.accelerator}}
    asks_gpu = [{"required": ["gpus"], "properties": {"gpus": {"minimum": 1}}},
                {"required": ["accelerator"]}]  # fmt: skip
    return {"properties": props, "anyOf": asks_gpu}


_INT_MAX = INTEGER_RANGE[1]
"""The largest integer a body carries (``gateway.decoding.INTEGER_RANGE``)."""


def resources_schema() -> dict[str, Any]:
    """A function's ``resources``, as ``functions.resources.Resources.from_json`` takes them
    (whether some pool fits them is the catalog's to say: a 400 naming its largest pool)."""
    return {
        "type": ["object", "null"],
        "minProperties": 1,
        "additionalProperties": False,
        "properties": {
            "cpu": {"type": "number", "exclusiveMinimum": 0},
            "memory": {"type": "integer", "minimum": 1, "maximum": _INT_MAX, "description": "MiB"},
            "gpus": {"type": "integer", "minimum": 0, "maximum": _INT_MAX},
            "accelerator": {"type": "string", "minLength": 1},
        },
    }


def env_schema() -> dict[str, Any]:
    """A function's ``env``, as ``jobenv.user_var_allowed`` (which registration applies)
    takes it: at most ``MAX_USER_VARS`` identifiers, none reserved by the pod (a denied or
    system name or prefix, a ``PYTHON*`` name not allowed), values without NUL of at most
    ``MAX_VALUE`` characters."""
    prefixes = "|".join(re.escape(p) for p in DENY_PREFIXES)
    reserved = {
        "anyOf": [
            {"enum": sorted(DENY_NAMES | SYSTEM_NAMES)},
            {"pattern": f"^({prefixes})"},
            {"allOf": [{"pattern": "^PYTHON"}, {"not": {"enum": sorted(PYTHON_ALLOWED)}}]},
        ]
    }
    return {
        "maxProperties": MAX_USER_VARS,
        "propertyNames": {"pattern": ENV_NAME_RE.pattern, "not": reserved},
        "additionalProperties": {
            "type": "string",
            "maxLength": MAX_VALUE,
            **_NO_NUL,
        },
    }


def job_schema() -> dict[str, Any]:
    """The job record every job route answers with (``Job.to_public``)."""
    attempt = {
        "type": "object",
        "required": ["id", "pods", "started", "finished"],
        "properties": {
            "id": {"type": "string", "description": "<job id>:<n>"},
            "pods": {"type": "array", "items": {"type": "string"}},
            "started": _NUMBER_OR_NULL,
            "finished": _NUMBER_OR_NULL,
            "exit_code": {"type": "integer", "description": "absent if no process exited"},
            "error": _ERROR_DETAIL,
        },
    }
    timings = ("submitted", "started", "first_instruction", "finished")
    return {
        "type": "object",
        "required": [
            "id",
            "function",
            "version",
            "caller",
            "sku",
            "state",
            "output",
            "error",
            "retries",
            "attempts",
            "acquisition",
            "timings",
        ],
        "properties": {
            "id": {"type": "string"},
            "function": {"type": "string"},
            "version": {"type": "integer"},
            "caller": {"type": "string"},
            "sku": {"type": "string"},
            "state": {"type": "string", "enum": [str(s) for s in JobState]},
            "lease_tag": {"type": ["string", "null"]},
            "queue": {"type": "string"},
            "priority": {"type": "integer"},
            "timeout_s": {
                **_NUMBER_OR_NULL,
                "description": "seconds each attempt may run: the call's timeout_s, else the "
                "function's (null only where a stored record does not say)",
            },
            "output": {"description": "the function's JSON return value (null until it ends)"},
            "output_expired": {"type": "boolean"},
            "output_omitted": {"type": "boolean", "description": "a listing left it out"},
            "error": {"oneOf": [{"type": "null"}, _ERROR_DETAIL]},
            "exit_code": {"type": "integer", "description": "rank 0's; absent if none exited"},
            "retries": {"type": "integer"},
            "attempts": {"type": "array", "items": attempt},
            "acquisition": {
                "type": ["object", "null"],
                "properties": {
                    "path": {"type": "string", "enum": list(PATH_ORDER)},
                    "reason": {"type": ["string", "null"]},
                },
            },
            "timings": {
                "type": "object",
                "required": list(timings),
                "properties": dict.fromkeys(timings, _NUMBER_OR_NULL),
            },
        },
    }


def body_schema(
    fields: Mapping[str, Field], extra: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """A JSON schema of a request body decoded with ``fields``; ``extra`` adds each field's
    constraints (ranges, patterns, lengths)."""
    props: dict[str, Any] = {}
    for name, f in fields.items():
        prop: dict[str, Any] = {}
        if object not in f.types:
            kinds = [_JSON_TYPES[t] for t in f.types]  # "number" takes integers too
            if f.nullable and not f.required:
                kinds.append("null")
            prop["type"] = kinds[0] if len(kinds) == 1 else kinds
        if f.default is not None:
            prop["default"] = f.default
        prop.update(extra.get(name, {}))
        props[name] = prop
    required = [name for name, f in fields.items() if f.required]
    schema: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        schema["required"] = required
    return schema


_PROBE_QUERY = {"description": "a query parameter the probe does not take"}


def _op(
    summary: str,
    ok: str = "200",
    *,
    body: dict[str, Any] | None = None,
    params: list[dict[str, Any]] | None = None,
    ok_content: dict[str, Any] | None = None,
    more: Mapping[str, str] | None = None,
    body_required: bool = True,
    accepted: dict[str, Any] | None = None,
    also_ok: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``also_ok``: other success statuses (and why), with the same content as ``ok``."""
    content = ok_content or {"application/json": {"schema": _OBJECT}}
    responses: dict[str, Any] = {
        ok: {"description": "OK", "content": content},
        **{
            status: {"description": why, "content": content}
            for status, why in (also_ok or {}).items()
        },
        "400": {
            "description": "a bad request: the field (or query parameter) is named",
            "content": _json(_ERROR),
        },
        "401": {"description": "no valid bearer token", "content": _json(_ERROR)},
        "403": {"description": "the token's role may not do this", "content": _json(_ERROR)},
        "500": {"description": "an internal error (logged)", "content": _json(_ERROR)},
        "503": {
            "description": "the broker is shutting down, its job store failed, or the JWKS "
            "a token needs could not be fetched: try again",
            "headers": {"Retry-After": _RETRY_AFTER},
            "content": _json(_ERROR),
        },
    }
    if accepted is not None:
        responses["202"] = {"description": "still running: poll its job", "content": accepted}
    for status, why in (more or {}).items():
        responses[status] = {"description": why, "content": _json(_ERROR)}
    op: dict[str, Any] = {"summary": summary, "security": [{"bearer": []}], "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": body_required, "content": _json(body)}
    if params:
        op["parameters"] = params
    return op


def _json(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": dict(schema)}}


def _path(name: str, **schema: Any) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "schema": {"type": "string", **schema}}


def _query(name: str, description: str, **schema: Any) -> dict[str, Any]:
    return {"name": name, "in": "query", "description": description, "schema": schema}


def _switch(name: str, does: str) -> dict[str, Any]:
    """A query flag: ``1`` or ``true`` turns it on."""
    return _query(name, f"1 or true: {does}", type="string", enum=["0", "1", "true", "false"])


def build_openapi(
    invoke_fields: Mapping[str, Field],
    function_fields: Mapping[str, Field],
    invoke_limits: Mapping[str, Mapping[str, Any]],
    max_listed: int,
) -> dict[str, Any]:
    """The whole document. ``invoke_limits``: ``app.check_invoke``'s ranges per field;
    ``max_listed``: the largest ``limit`` of ``GET /v1/jobs``."""
    name = _path("name", pattern=NAME_RE.pattern)
    sha = _path("sha256", pattern=DIGEST_RE.pattern)
    job_id = _path("id")
    invoke = body_schema(invoke_fields, invoke_limits)
    invoke["properties"]["input"].update(JSON_VALUE)
    function = body_schema(
        function_fields,
        {
            "name": {"pattern": NAME_RE.pattern},
            "package_digest": {"pattern": DIGEST_RE.pattern},
            "entrypoint": {"pattern": ENTRYPOINT_RE.pattern, "maxLength": 255},
            "command": {"minItems": 1, "items": {"type": "string", "minLength": 1, **_NO_NUL}},
            "env": env_schema(),
            "requirements": {"pattern": DIGEST_RE.pattern},
            "timeout_s": {"exclusiveMinimum": 0, "maximum": 86400},
            "max_retries": {"minimum": 0, "maximum": 10},
            "pods": {"minimum": 1, "maximum": 64},
        },
    )
    function["properties"]["resources"].update(resources_schema())
    function["allOf"] = [
        {  # exactly one of them, as ``FunctionSpec.validate`` demands
            "oneOf": [
                {
                    "required": ["entrypoint"],
                    "properties": {"entrypoint": {"type": "string"}, "command": {"type": "null"}},
                },
                {
                    "required": ["command"],
                    "properties": {"command": {"type": "array"}, "entrypoint": {"type": "null"}},
                },
            ]
        },
        {  # a pool by name, or what the function needs (registration rounds it up)
            "oneOf": [
                {
                    "required": ["sku"],
                    "properties": {"sku": {"type": "string"}, "resources": {"type": "null"}},
                },
                {
                    "required": ["resources"],
                    "properties": {"resources": {"type": "object"}, "sku": {"type": "null"}},
                },
            ]
        },
    ]
    idempotency = {
        "name": "Idempotency-Key",
        "in": "header",
        "description": "the same key and body return the same job; another body is a 422",
        "schema": {
            "type": "string",
            "minLength": 1,
            "maxLength": invoke_limits["lease_tag"]["maxLength"],
        },
    }
    job_made = {
        "application/json": {
            "schema": {
                "type": "object",
                "properties": {"job_id": {"type": "string"}, "state": {"type": "string"}},
            }
        }
    }
    reused_key = "the Idempotency-Key was used with another body"
    gone = {"410": "its output and logs are past the retention"}
    unavailable = {"404": "no such function", "413": "body too large"}
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "Firepool", "version": "1"},
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}
            },
            "schemas": {
                "Error": {
                    "type": "object",
                    "required": ["error"],
                    "properties": {"error": _ERROR_DETAIL},
                },
                "Job": job_schema(),
                "JsonValue": json_value_schema(),
            },
        },
        "paths": {
            "/v1/blobs/{sha256}": {
                "parameters": [sha],
                "get": {
                    "summary": "A package, for a pod: the signed URL is the credential",
                    "security": [],
                    "parameters": [
                        {
                            "name": "exp",
                            "in": "query",
                            "required": True,
                            "schema": {"type": "integer"},
                            "description": "expiry, epoch seconds",
                        },
                        {
                            "name": "sig",
                            "in": "query",
                            "required": True,
                            "schema": {"type": "string"},
                            "description": "HMAC of digest|exp",
                        },
                    ],
                    "responses": {
                        "200": {
                            "description": "the package's bytes",
                            "content": {"application/zip": {"schema": {"type": "string"}}},
                        },
                        "400": {"description": "a bad digest or exp", "content": _json(_ERROR)},
                        "403": {"description": "a bad signature", "content": _json(_ERROR)},
                        "404": {"description": "not stored", "content": _json(_ERROR)},
                        "410": {"description": "the URL expired", "content": _json(_ERROR)},
                    },
                },
            },
            "/v1/packages/{sha256}": {
                "parameters": [sha],
                "put": {
                    **_op(
                        "Upload a package zip once (digest checked)",
                        "201",
                        more={
                            "413": "body too large, or over the caller's storage quota "
                            "(`QuotaExceeded`)",
                            "422": "digest or zip rejected",
                        },
                        also_ok={"200": "already stored (`created` is false)"},
                    ),
                    "requestBody": {
                        "required": True,
                        "content": {
                            "application/zip": {
                                "schema": {"type": "string", "contentMediaType": "application/zip"}
                            },
                            "application/octet-stream": {"schema": {"type": "string"}},
                        },
                    },
                },
                "head": {
                    "summary": "Does the package exist?",
                    "security": [{"bearer": []}],
                    "responses": {
                        "200": {"description": "stored"},
                        "400": {"description": "not a sha256 digest"},
                        "401": {"description": "no valid bearer token"},
                        "403": {"description": "the token's role may not do this"},
                        "404": {"description": "not stored"},
                    },
                },
            },
            "/v1/packages/{sha256}/uploads": {
                "parameters": [sha],
                "post": _op(
                    "Ask to upload a package of `size` bytes: `transfer` is `none` (this "
                    "caller already uploaded it: 0 bytes to send), `broker` (PUT it to "
                    "/v1/packages/{sha256}) or `s3` (send `parts` to their presigned URLs, "
                    "then complete with `ticket`); 503 + Retry-After when the object store "
                    "is down",
                    body={
                        "type": "object",
                        "required": ["size"],
                        "properties": {
                            "size": {"type": "integer", "minimum": 0, "maximum": MAX_PACKAGE_BYTES}
                        },
                        "additionalProperties": False,
                    },
                    more={"413": "over the size cap or the caller's storage quota"},
                ),
            },
            "/v1/packages/{sha256}/uploads:complete": {
                "parameters": [sha],
                "post": _op(
                    "Complete a direct upload: the broker verifies the stored object's "
                    "SHA-256, then records the caller as an uploader",
                    "201",
                    body={
                        "type": "object",
                        "required": ["ticket"],
                        "properties": {
                            "ticket": {"type": "string"},
                            "etags": {"type": "array", "items": {"type": "string"}},
                        },
                        "additionalProperties": False,
                    },
                    more={"410": "the ticket expired", "422": "the bytes do not check out"},
                    also_ok={"200": "already stored (`created` is false)"},
                ),
            },
            "/v1/functions": {
                "post": _op(
                    "Register a function version (upload its package first)",
                    "201",
                    body=function,
                    more={
                        "404": "the package (or requirements file) is not uploaded: the field "
                        "is named",
                        "413": "body too large",
                        "422": "the package is not an acceptable zip",
                    },
                ),
                "get": _op("List functions"),
            },
            "/v1/functions/{name}": {
                "parameters": [name],
                "get": _op("Describe a function", more={"404": "no such function"}),
                "delete": _op("Delete a function", more={"404": "no such function"}),
            },
            "/v1/functions/{name}:invoke": {
                "parameters": [name],
                "post": _op(
                    "Invoke and wait for the result (202 with the job id if it is still "
                    "running after the broker's sync_wait_s)",
                    body=invoke,
                    params=[idempotency],
                    ok_content=_json(_JOB),
                    more={**unavailable, "422": reused_key},
                    accepted=job_made,
                    body_required=False,
                ),
            },
            "/v1/functions/{name}/jobs": {
                "parameters": [name],
                "post": _op(
                    "Submit an async job",
                    "202",
                    body=invoke,
                    params=[idempotency],
                    ok_content=job_made,
                    more={**unavailable, "422": reused_key},
                    body_required=False,
                ),
            },
            "/v1/jobs": {
                "get": _op(
                    "List your jobs (an admin's: everyone's), newest first: no inputs, and "
                    "outputs up to max_json_bytes in all (`output_omitted` marks the rest)",
                    ok_content=_json(
                        {
                            "type": "object",
                            "required": ["jobs"],
                            "properties": {"jobs": {"type": "array", "items": _JOB}},
                        }
                    ),
                    params=[
                        _query(
                            "limit",
                            "at most this many",
                            type="integer",
                            minimum=1,
                            maximum=max_listed,
                            default=100,
                        ),
                        _query(
                            "state",
                            "only jobs in this state (any case)",
                            type="string",
                            enum=[str(s) for s in JobState],
                        ),
                    ],
                ),
            },
            "/v1/jobs/{id}": {
                "parameters": [job_id],
                "get": _op(
                    "Job status and result",
                    ok_content=_json(_JOB),
                    more={"404": "no such job of yours", **gone},
                ),
                "delete": _op(
                    "Cancel a job (answers the job as it stands)",
                    ok_content=_json(_JOB),
                    more={"404": "no such job of yours", **gone},
                ),
            },
            "/v1/jobs/{id}/logs": {
                "parameters": [job_id],
                "get": _op(
                    "Job logs, live while it runs",
                    params=[_switch("follow", "stream until the job ends")],
                    ok_content={  # the bytes the job wrote, whatever they are
                        "application/octet-stream": {"schema": {"type": "string"}}
                    },
                    more={"404": "no such job of yours", **gone},
                ),
            },
            "/v1/pools": {
                "get": _op(
                    "Pools: pods by state and role, queue, holds, pods failing to start, "
                    "budgets and held unit-seconds",
                    params=[_switch("pods", "list every pod too")],
                )
            },
            "/healthz": {
                "get": {
                    "summary": "Liveness",
                    "responses": {"200": {"description": "OK"}, "400": _PROBE_QUERY},
                }
            },
            "/readyz": {
                "get": {
                    "summary": "Readiness",
                    "responses": {
                        "200": {"description": "ready"},
                        "400": _PROBE_QUERY,
                        "503": {
                            "description": "starting or shutting down",
                            "headers": {"Retry-After": _RETRY_AFTER},
                        },
                    },
                }
            },
            "/metrics": {
                "get": {
                    "summary": "Prometheus metrics",
                    "responses": {
                        "200": {
                            "description": "OK",
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        },
                        "400": _PROBE_QUERY,
                    },
                }
            },
        },
    }
    return _with_heads(_with_links(document))


_OPERATION_IDS = {
    ("/v1/functions", "post"): "createFunction",
    ("/v1/functions/{name}", "get"): "getFunction",
    ("/v1/functions/{name}", "delete"): "deleteFunction",
    ("/v1/functions/{name}:invoke", "post"): "invokeFunction",
    ("/v1/functions/{name}/jobs", "post"): "submitJob",
    ("/v1/jobs/{id}", "get"): "getJob",
    ("/v1/jobs/{id}", "delete"): "cancelJob",
    ("/v1/jobs/{id}/logs", "get"): "getJobLogs",
}
"""The operations the links below join, by the ids they are linked with."""


def _link(operation_id: str, parameter: str, expression: str) -> dict[str, Any]:
    return {"operationId": operation_id, "parameters": {parameter: expression}}


def _job_links(expression: str) -> dict[str, Any]:
    """Links from an answer that names a job (``expression``: where its id is)."""
    return {
        "GetJob": _link("getJob", "id", expression),
        "GetJobLogs": _link("getJobLogs", "id", expression),
        "CancelJob": _link("cancelJob", "id", expression),
    }


def _with_links(document: dict[str, Any]) -> dict[str, Any]:
    """OpenAPI links, the paths a client (or a stateful fuzzer) takes through the API:
    register a function, invoke it or submit a job, then read the job, its logs, cancel it."""
    paths = document["paths"]
    for (path, method), operation_id in _OPERATION_IDS.items():
        paths[path][method]["operationId"] = operation_id
    name = "$response.body#/name"
    paths["/v1/functions"]["post"]["responses"]["201"]["links"] = {
        "InvokeFunction": _link("invokeFunction", "name", name),
        "SubmitJob": _link("submitJob", "name", name),
        "GetFunction": _link("getFunction", "name", name),
        "DeleteFunction": _link("deleteFunction", "name", name),
    }
    invoke = paths["/v1/functions/{name}:invoke"]["post"]["responses"]
    invoke["200"]["links"] = _job_links("$response.body#/id")
    invoke["202"]["links"] = _job_links("$response.body#/job_id")
    submit = paths["/v1/functions/{name}/jobs"]["post"]["responses"]
    submit["202"]["links"] = _job_links("$response.body#/job_id")
    job = paths["/v1/jobs/{id}"]["get"]["responses"]["200"]
    job["links"] = {k: v for k, v in _job_links("$response.body#/id").items() if k != "GetJob"}
    return document


def _with_heads(document: dict[str, Any]) -> dict[str, Any]:
    """Declare ``HEAD`` beside every ``GET``: Starlette answers it for each (the headers of
    the ``GET``, no body), and a document without it disagreed with the server."""
    for ops in document["paths"].values():
        get = ops.get("get")
        if get is not None and "head" not in ops:
            head = {k: v for k, v in get.items() if k not in ("responses", "summary")}
            head["summary"] = f"{get['summary']} (headers only)"
            if "operationId" in get:
                head["operationId"] = f"{get['operationId']}Head"
            head["responses"] = {
                code: {"description": answer["description"]}
                for code, answer in get["responses"].items()
            }
            ops["head"] = head
    return document
