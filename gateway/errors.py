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
    ErrorClass.QUOTA_EXCEEDED: 413,
    ErrorClass.TOO_LARGE: 413,
    ErrorClass.UNAVAILABLE: 503,
    ErrorClass.STORE_UNAVAILABLE: 503,
    ErrorClass.PACKAGE_FETCH_FAILED: 502,
}


def http_status(error: FirepoolError) -> int:
    return STATUS.get(error.error_class, 500)


def error_headers(error: FirepoolError) -> dict[str, str]:
    """Headers an error's answer carries: ``Retry-After`` for one that says when to try again
    (``StoreUnavailable``)."""
    retry_after = getattr(error, "retry_after_s", None)
    return {} if retry_after is None else {"Retry-After": str(retry_after)}


def error_body(error: FirepoolError) -> dict[str, object]:
    return {"error": error.to_json()}
