"""The one place that maps typed errors to HTTP status codes and JSON error bodies."""

from __future__ import annotations

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
    ErrorClass.QUOTA_EXCEEDED: 429,
    ErrorClass.TOO_LARGE: 413,
    ErrorClass.UNAVAILABLE: 503,
}


RETRY_AFTER_S = 2
"""What a 503 ``Unavailable`` tells a client to wait (``Retry-After``) before it tries again:
a job store failing for a moment, or a broker restarting, is back within seconds, and a
client that retries at once only adds load to a store coming back."""


def http_status(error: FirepoolError) -> int:
    return STATUS.get(error.error_class, 500)


def error_headers(error: FirepoolError) -> dict[str, str]:
    """The headers beside ``error``'s body: ``Retry-After`` on every 503."""
    if http_status(error) == 503:
        return {"Retry-After": str(RETRY_AFTER_S)}
    return {}


def error_body(error: FirepoolError) -> dict[str, object]:
    return {"error": error.to_json()}
