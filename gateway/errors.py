"""The one place that maps typed errors to HTTP status codes, JSON error bodies and the
headers that go with them (``Retry-After`` on every refusal for capacity or quota)."""

from __future__ import annotations

import math

from functions.errors import ErrorClass, FirepoolError

STATUS: dict[ErrorClass, int] = {
    ErrorClass.UNKNOWN_FIELD: 400,
    ErrorClass.INVALID_REQUEST: 400,
    ErrorClass.UNAUTHORIZED: 401,
    ErrorClass.FORBIDDEN: 403,
    ErrorClass.NOT_FOUND: 404,
    ErrorClass.CONFLICT: 409,
    ErrorClass.EXPIRED: 410,
    ErrorClass.IDEMPOTENCY_MISMATCH: 422,
    ErrorClass.PACKAGE_REJECTED: 422,
    ErrorClass.QUOTA_EXCEEDED: 413,
    ErrorClass.TOO_LARGE: 413,
    ErrorClass.UNAVAILABLE: 503,
    ErrorClass.STORE_UNAVAILABLE: 503,
    ErrorClass.PACKAGE_FETCH_FAILED: 502,
}
RETRIED_STATUS = frozenset({429, 503})
"""Refusals for capacity or quota: a client may send the same request again later."""
RETRY_AFTER_S = 2
"""What ``Retry-After`` says when the error names no delay of its own: a job store failing
for a moment, or a broker starting or stopping, is back within seconds, and a client that
retries at once only adds load to a store coming back."""


def http_status(error: FirepoolError) -> int:
    return STATUS.get(error.error_class, 500)


def error_body(error: FirepoolError) -> dict[str, object]:
    return {"error": error.to_json()}


def error_headers(error: FirepoolError) -> dict[str, str]:
    """``Retry-After`` (whole seconds, at least 1) for a refusal a client may send again
    (``RETRIED_STATUS``): the error's own ``retry_after_s`` or ``RETRY_AFTER_S``."""
    if http_status(error) not in RETRIED_STATUS:
        return {}
    return {"Retry-After": retry_after(error.retry_after_s)}


def retry_after(seconds: float | None) -> str:
    """A ``Retry-After`` value: ``seconds`` (``RETRY_AFTER_S`` if None) rounded up."""
    return str(max(1, math.ceil(RETRY_AFTER_S if seconds is None else seconds)))
