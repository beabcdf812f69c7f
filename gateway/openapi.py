"""The API schema served at /openapi.json (hand-written: the routes are few and stable)."""

from __future__ import annotations

from typing import Any

_JSON = {"application/json": {"schema": {"type": "object"}}}


def _op(summary: str, body: bool = False, status: str = "200") -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": summary,
        "security": [{"bearer": []}],
        "responses": {
            status: {"description": "OK", "content": _JSON},
            "4XX": {"description": "typed error {error: {class, message, field?}}"},
        },
    }
    if body:
        op["requestBody"] = {"content": _JSON}
    return op


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Firepool", "version": "1"},
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}}
    },
    "paths": {
        "/v1/packages/{sha256}": {
            "put": _op("Upload a package zip once (digest checked)", True, "201"),
            "head": _op("Does the package exist?"),
        },
        "/v1/functions": {
            "post": _op("Register a function version", True, "201"),
            "get": _op("List functions"),
        },
        "/v1/functions/{name}": {
            "get": _op("Describe a function"),
            "delete": _op("Delete a function"),
        },
        "/v1/functions/{name}:invoke": {"post": _op("Invoke and wait for the result", True)},
        "/v1/functions/{name}/jobs": {"post": _op("Submit an async job", True, "202")},
        "/v1/jobs": {"get": _op("List your jobs")},
        "/v1/jobs/{id}": {"get": _op("Job status and result"), "delete": _op("Cancel a job")},
        "/v1/jobs/{id}/logs": {"get": _op("Job logs (?follow=1 streams)")},
        "/v1/pools": {
            "get": _op("Pools: pods by state and role, queue, holds, budgets and held unit-seconds")
        },
        "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "OK"}}}},
        "/readyz": {"get": {"summary": "Readiness", "responses": {"200": {"description": "OK"}}}},
        "/metrics": {
            "get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "OK"}}}
        },
    },
}
