"""What the SDK raises: the gateway's refusals (``ApiError``), answers that are not the API's
(``UnexpectedAnswer``), a wait that ran out (``JobNotFinished``) and a job that ended without
its output (``JobFailed``, one subclass per job error class).

``raise_for_job`` is the one place that turns a job record into its typed exception; both
clients call it, so ``invoke`` raises the same class sync and async.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import orjson

from functions.errors import ErrorClass


class ClientError(Exception):
    """Base of what a client call raises for the gateway's answer or a job's outcome. A
    gateway that does not answer at all raises the HTTP library's transport error
    (``httpx.TransportError``, ``aiohttp.ClientConnectionError``) once retries are spent;
    a bad argument caught before any request, ``functions.errors.InvalidRequest``."""


class ApiError(ClientError):
    """The gateway refused: ``status`` and its typed ``error_class`` (``QuotaExceeded``,
    ``NotFound``...). ``retry_after_s``: the refusal's ``Retry-After``, when it said one."""

    def __init__(
        self,
        status: int,
        error_class: str,
        message: str,
        field: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"{status} {error_class}: {message}")
        self.status = status
        self.error_class = error_class
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s


class PoolExhausted(ApiError):
    """A refusal for capacity or quota (429 ``QuotaExceeded``, 503 ``Unavailable``): a
    handle's call raises it once its retry deadline is spent, a lower-level method (which
    sends once) at the first refusal."""


class UnexpectedAnswer(ApiError):
    """The server at the client's URL answered something other than the Firepool API's
    JSON (or, for logs, its byte stream): an HTML page, a proxy's error, another service.
    Most often the URL is wrong. ``error_class`` is ``HTTPError``; the message is one line,
    never the page."""

    def __init__(self, url: str, status: int, content_type: str) -> None:
        kind = content_type.partition(";")[0].strip() or "no type"
        super().__init__(
            status,
            "HTTPError",
            f"{url} answered HTTP {status} with {kind}, not the Firepool API: "
            "is that the gateway's URL?",
        )
        self.args = (self.message,)


class JobNotFinished(ClientError, TimeoutError):
    """A wait gave up before the job ended; ``job`` is its record as last read. (Raised
    rather than returning the unfinished job, which a caller would take for a result.)"""

    def __init__(self, job: dict[str, Any], timeout_s: float) -> None:
        super().__init__(f"job {job.get('id')} is still {job.get('state')} after {timeout_s:g} s")
        self.job = job


class JobFailed(ClientError):
    """The job ended ``FAILED`` or ``CANCELLED``: ``error_class`` and ``message`` are its
    record's ``error``, ``job`` the whole record (attempts, logs' job id, exit code)."""

    def __init__(self, job: dict[str, Any]) -> None:
        error = job.get("error") or {}
        self.job = job
        self.job_id = str(job.get("id"))
        self.error_class = str(error.get("class", ErrorClass.INTERNAL))
        self.message = str(error.get("message", ""))
        state = job.get("state")
        super().__init__(f"job {self.job_id} {state}: {self.error_class}: {self.message}")


class FunctionError(JobFailed):
    """The function raised (its traceback is in the message)."""


class NonZeroExit(JobFailed):
    """The command, or the process running the function, exited non-zero."""


class OutOfMemory(JobFailed):
    """The job passed its pool's memory limit (``OOM``)."""


class JobTimeout(JobFailed, TimeoutError):
    """An attempt ran past its ``timeout_s`` (``Timeout``)."""


class JobCancelled(JobFailed):
    """Someone cancelled the job (``Cancelled``)."""


class PodLost(JobFailed):
    """The job's pod vanished more often than its retries allow (``PodLost``)."""


class DependencyInstallFailed(JobFailed):
    """The function's requirements did not install in the pod."""


class FunctionNotFound(JobFailed):
    """The function was deleted while the job waited (``NotFound``)."""


JOB_ERRORS: Mapping[str, type[JobFailed]] = {
    ErrorClass.FUNCTION_ERROR: FunctionError,
    ErrorClass.NON_ZERO_EXIT: NonZeroExit,
    ErrorClass.OOM: OutOfMemory,
    ErrorClass.TIMEOUT: JobTimeout,
    ErrorClass.CANCELLED: JobCancelled,
    ErrorClass.POD_LOST: PodLost,
    ErrorClass.DEPENDENCY_INSTALL_FAILED: DependencyInstallFailed,
    ErrorClass.NOT_FOUND: FunctionNotFound,
}
"""A job record's ``error.class`` -> what ``invoke`` raises; any other class: ``JobFailed``."""

CAPACITY_CLASSES = frozenset({str(ErrorClass.QUOTA_EXCEEDED), str(ErrorClass.UNAVAILABLE)})


def job_output(job: dict[str, Any]) -> Any:
    """A ended job's output, or its typed ``JobFailed`` for one that did not succeed."""
    if job.get("state") == "SUCCEEDED":
        return job.get("output")
    error = job.get("error") or {}
    raise JOB_ERRORS.get(str(error.get("class")), JobFailed)(job)


def retry_after(value: str | None) -> float | None:
    """A ``Retry-After`` header's delay in seconds (delta-seconds form; an HTTP date or junk
    is ignored: the client then backs off on its own)."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def api_error(
    url: str, status: int, content_type: str, body: bytes, retry_after_header: str | None
) -> ApiError:
    """The typed refusal in an error answer: ``ApiError`` (``PoolExhausted`` for a capacity
    class) from the API's JSON error body, ``UnexpectedAnswer`` for anything else."""
    try:
        error = orjson.loads(body)["error"] if _is_json(content_type) else None
        if error is not None:
            kind = PoolExhausted if error["class"] in CAPACITY_CLASSES else ApiError
            return kind(
                status,
                str(error["class"]),
                str(error["message"]),
                error.get("field"),
                retry_after(retry_after_header),
            )
    except (ValueError, KeyError, TypeError):
        pass
    return UnexpectedAnswer(url, status, content_type)


def _is_json(content_type: str) -> bool:
    return content_type.partition(";")[0].strip() == "application/json"
