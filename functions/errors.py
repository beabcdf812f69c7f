"""Typed errors shared by every layer.

Each error carries an ``error_class``: the string a caller sees in a job record or an HTTP
error body. Which classes are retried is ``broker.retry_policy``'s decision; exactly one
place, ``gateway.errors``, maps these to HTTP status codes.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorClass(StrEnum):
    """Every error class a caller can observe, in a job record or an HTTP error body."""

    UNKNOWN_FIELD = "UnknownField"
    INVALID_REQUEST = "InvalidRequest"
    UNAUTHORIZED = "Unauthorized"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    CONFLICT = "Conflict"
    IDEMPOTENCY_MISMATCH = "IdempotencyMismatch"
    PACKAGE_REJECTED = "PackageRejected"
    DEPENDENCY_INSTALL_FAILED = "DependencyInstallFailed"
    FUNCTION_ERROR = "FunctionError"
    NON_ZERO_EXIT = "NonZeroExit"
    OOM = "OOM"
    TIMEOUT = "Timeout"
    CANCELLED = "Cancelled"
    POD_LOST = "PodLost"
    QUOTA_EXCEEDED = "QuotaExceeded"
    EXPIRED = "Expired"
    TOO_LARGE = "TooLarge"
    UNAVAILABLE = "Unavailable"
    STORE_UNAVAILABLE = "StoreUnavailable"
    PACKAGE_FETCH_FAILED = "PackageFetchFailed"
    INTERNAL = "InternalError"


class FirepoolError(Exception):
    """Base of every typed error. ``field`` names the offending input field, when there is one."""

    error_class: ErrorClass = ErrorClass.INTERNAL

    def __init__(
        self, message: str, *, field: str | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s
        """For a refusal a caller may send again (quota, capacity): when to, if known."""

    def to_json(self) -> dict[str, str]:
        body = {"class": str(self.error_class), "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body


class UnknownField(FirepoolError):
    error_class = ErrorClass.UNKNOWN_FIELD


class InvalidRequest(FirepoolError):
    error_class = ErrorClass.INVALID_REQUEST


class Unauthorized(FirepoolError):
    error_class = ErrorClass.UNAUTHORIZED


class Forbidden(FirepoolError):
    error_class = ErrorClass.FORBIDDEN


class NotFound(FirepoolError):
    error_class = ErrorClass.NOT_FOUND


class Conflict(FirepoolError):
    error_class = ErrorClass.CONFLICT


class IdempotencyMismatch(FirepoolError):
    error_class = ErrorClass.IDEMPOTENCY_MISMATCH


class PackageRejected(FirepoolError):
    error_class = ErrorClass.PACKAGE_REJECTED


class QuotaExceeded(FirepoolError):
    error_class = ErrorClass.QUOTA_EXCEEDED


class Expired(FirepoolError):
    error_class = ErrorClass.EXPIRED


class TooLarge(FirepoolError):
    error_class = ErrorClass.TOO_LARGE


class Unavailable(FirepoolError):
    error_class = ErrorClass.UNAVAILABLE


class StoreUnavailable(FirepoolError):
    """The object store holding packages and logs is down or refused the broker's request (a
    connection refused, a 5xx, credentials it does not accept). Nothing was stored; the same
    request may succeed after ``retry_after_s`` (the API's 503 ``Retry-After``)."""

    error_class = ErrorClass.STORE_UNAVAILABLE

    def __init__(self, message: str, *, retry_after_s: int = 5, field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.retry_after_s = retry_after_s


class PackageFetchFailed(FirepoolError):
    """A pod could not fetch its package: the server refused the URL (tampered, expired: a
    403), or the store stayed unreachable until the attempt's deadline. No user code ran."""

    error_class = ErrorClass.PACKAGE_FETCH_FAILED
