"""Python SDK: deploy packages and functions, invoke them, follow jobs.

    from functions.sdk import Client
    fp = Client("http://127.0.0.1:8080", token)
    fp.deploy("examples/verifier", name="verify", sku="cpu", entrypoint="verifier:verify")
    job = fp.invoke("verify", {"code": "...", "tests": "..."}, lease_tag="episode-1")

Every non-2xx answer raises ``ApiError`` carrying the server's typed error class; an answer
that is not the API's at all (an HTML page from a wrong URL) raises ``UnexpectedAnswer``. The
client keeps one HTTP connection pool; use it as a context manager or call ``close()``.
"""

from __future__ import annotations

import json
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NoReturn

import httpx
import orjson

from functions.errors import InvalidRequest
from functions.package_transfer import send_package
from functions.packaging import package_file, sha256_hex

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def _json_body(value: Any) -> bytes:
    """``value`` as the JSON the gateway takes, or ``InvalidRequest``: orjson writes NaN and
    Infinity as ``null`` (a function got ``{"x": None}`` for ``{"x": nan}``) and refuses an
    integer past 64 bits; the gateway refuses both over HTTP, so the SDK does not change
    them into something else on the way."""
    try:
        content = orjson.dumps(value)
    except TypeError as exc:  # an integer past 64 bits, or a type JSON has no form for
        raise InvalidRequest(f"the request cannot be sent as JSON: {exc}") from None
    if b"null" in content:  # only then may a NaN or Infinity have become one
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise InvalidRequest(
                "the request holds NaN or Infinity, which JSON has no form for (send them "
                "as strings)"
            ) from None
        except TypeError:  # a type only orjson writes (datetime, dataclass): not checked
            pass
    return content


def _segment(value: str) -> str:
    """``value`` as one path segment: percent-encoded, so a job id or name of
    ``../functions/x`` (or with ``?``) cannot walk to another route (``firepool cancel
    ../functions/NAME`` would delete the function NAME). ``.`` and ``..``, which no encoding
    keeps from being walked, are refused, and so is ``/`` (the server decodes ``%2F`` before
    it routes: ``ID%2Flogs`` would reach the logs route)."""
    if value in ("", ".", "..") or "/" in value:  # the server decodes %2F before routing
        raise InvalidRequest(f"{value!r} is not a job id or name")
    return urllib.parse.quote(value, safe="")


class ClientError(Exception):
    """Base of what a ``Client`` call raises for the gateway's answer: ``ApiError`` (it
    refused, with its typed error) and ``JobNotFinished`` (a ``wait`` ran out). A gateway
    that does not answer at all raises ``httpx.TransportError``; a bad argument caught
    before any request, ``functions.errors.InvalidRequest``."""


class JobNotFinished(ClientError, TimeoutError):
    """``wait`` gave up before the job ended; ``job`` is its record as last read. (Raised
    rather than returning the unfinished job, which a caller would take for a result.)"""

    def __init__(self, job: dict[str, Any], timeout_s: float) -> None:
        super().__init__(f"job {job.get('id')} is still {job.get('state')} after {timeout_s:g} s")
        self.job = job


class ApiError(ClientError):
    def __init__(self, status: int, error_class: str, message: str, field: str | None = None):
        super().__init__(f"{status} {error_class}: {message}")
        self.status = status
        self.error_class = error_class
        self.message = message
        self.field = field


class UnexpectedAnswer(ApiError):
    """The server at the client's URL answered something other than the Firepool API's
    JSON (or, for logs, its byte stream): an HTML page, a proxy's error, another service.
    Most often the URL is wrong. ``error_class`` is ``HTTPError``; the message is one line,
    never the page."""

    def __init__(self, url: str, resp: httpx.Response) -> None:
        kind = resp.headers.get("content-type", "").partition(";")[0].strip() or "no type"
        super().__init__(
            resp.status_code,
            "HTTPError",
            f"{url} answered HTTP {resp.status_code} with {kind}, not the Firepool API: "
            "is that the gateway's URL?",
        )
        self.args = (self.message,)


_JSON = "application/json"
_LOG_BYTES = "application/octet-stream"


def _is(resp: httpx.Response, media_type: str) -> bool:
    return resp.headers.get("content-type", "").partition(";")[0].strip() == media_type


class Client:
    def __init__(self, url: str, token: str, timeout: float = 120.0) -> None:
        if not token.isascii() or not token.isprintable():
            raise InvalidRequest("the token has characters no HTTP header can carry")
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            timeout=timeout,
            headers={"Authorization": f"Bearer {token}"},
        )
        self.bytes_uploaded = 0
        """Package bytes this client sent (``functions.package_transfer``): 0 for a deploy
        of bytes its caller had uploaded before."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
    ) -> httpx.Response:
        if json is not None:
            content = _json_body(json)
            headers = {**(headers or {}), "Content-Type": "application/json"}
        resp = self._http.request(method, path, content=content, headers=headers, params=params)
        if resp.status_code >= 400:
            self._raise(resp)
        return resp

    def _call(self, method: str, path: str, key: str, **kwargs: Any) -> dict[str, Any]:
        """``_request``'s answer: the API's JSON object, which has ``key``."""
        return self._json(self._request(method, path, **kwargs), key)

    def _json(self, resp: httpx.Response, key: str) -> dict[str, Any]:
        """``resp``'s body as the API's JSON object, which has ``key``; anything else (a
        page, another service's JSON) is ``UnexpectedAnswer``."""
        try:
            body = orjson.loads(resp.content) if _is(resp, _JSON) else None
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict) or key not in body:
            raise UnexpectedAnswer(str(self._http.base_url), resp)
        return body

    def _raise(self, resp: httpx.Response) -> NoReturn:
        try:
            err = orjson.loads(resp.content)["error"] if _is(resp, _JSON) else None
            if err is not None:
                raise ApiError(resp.status_code, err["class"], err["message"], err.get("field"))
        except (ValueError, KeyError, TypeError):
            pass
        raise UnexpectedAnswer(str(self._http.base_url), resp)

    # -- packages and functions ---------------------------------------------------------
    def upload(self, data: bytes, content_type: str = "application/zip") -> str:
        """Upload bytes content-addressed (skipped when the server has them from this caller:
        only the callers who uploaded a package may use it); return digest.
        ``application/zip`` is checked as a package; anything else (a requirements file,
        ``text/plain``) is stored as it is."""
        digest = sha256_hex(data)
        self._upload(digest, len(data), data, content_type)
        return digest

    def upload_file(
        self, file: BinaryIO, digest: str, size: int, content_type: str = "application/zip"
    ) -> str:
        """``upload`` for a file of ``size`` bytes whose sha256 is ``digest``: streamed from
        its start in chunks with a known Content-Length, never held whole."""

        self._upload(digest, size, file, content_type)
        return digest

    def _upload(self, digest: str, size: int, content: bytes | BinaryIO, content_type: str) -> None:
        _segment(digest)  # refuses a digest that would walk to another route
        sent = send_package(self._http, self._raise, digest, size, content, content_type)
        self.bytes_uploaded += sent.bytes_sent

    def deploy(
        self,
        directory: str | Path,
        *,
        name: str,
        sku: str,
        entrypoint: str | None = None,
        command: list[str] | None = None,
        requirements: str | Path | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float = 300.0,
        max_retries: int = 2,
        pods: int = 1,
        single_use: bool = False,
    ) -> dict[str, Any]:
        with package_file(Path(directory)) as package:  # on disk: one chunk in memory
            digest = self.upload_file(package.file, package.digest, package.size)
        body: dict[str, Any] = {
            "name": name,
            "sku": sku,
            "package_digest": digest,
            "timeout_s": timeout_s,
            "max_retries": max_retries,
            "pods": pods,
            "single_use": single_use,
        }
        if entrypoint is not None:
            body["entrypoint"] = entrypoint
        if command is not None:
            body["command"] = command
        if requirements is not None:
            body["requirements"] = self.upload(Path(requirements).read_bytes(), "text/plain")
        if env:
            body["env"] = env
        return self._call("POST", "/v1/functions", "version", json=body)

    def functions(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/functions", "functions")["functions"])

    def function(self, name: str) -> dict[str, Any]:
        """The latest version of ``name``."""
        return self._call("GET", f"/v1/functions/{_segment(name)}", "version")

    def delete_function(self, name: str) -> dict[str, Any]:
        """Hide every version of ``name``: calls to it then answer ``NotFound``."""
        return self._call("DELETE", f"/v1/functions/{_segment(name)}", "deleted")

    # -- jobs ---------------------------------------------------------------------------
    def _post_job(
        self,
        path: str,
        input: Any,
        lease_tag: str | None,
        queue: str | None,
        priority: int | None,
        timeout_s: float | None,
        idempotency_key: str | None,
    ) -> httpx.Response:
        body: dict[str, Any] = {"input": input}
        for key, value in (
            ("lease_tag", lease_tag),
            ("queue", queue),
            ("priority", priority),
            ("timeout_s", timeout_s),
        ):
            if value is not None:
                body[key] = value
        headers = None
        if idempotency_key is not None:  # "" too: the gateway refuses it, by name
            if not idempotency_key.isascii() or not idempotency_key.isprintable():
                raise InvalidRequest(
                    "an Idempotency-Key is printable ASCII", field="Idempotency-Key"
                )
            headers = {"Idempotency-Key": idempotency_key}
        return self._request("POST", path, json=body, headers=headers)

    def invoke(
        self,
        name: str,
        input: Any = None,
        *,
        lease_tag: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        timeout_s: float | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        """Run ``name`` and return its job record once it ends (waits past the server's cap)."""
        resp = self._post_job(
            f"/v1/functions/{_segment(name)}:invoke",
            input,
            lease_tag,
            queue,
            priority,
            timeout_s,
            idempotency_key,
        )
        if resp.status_code == 202:
            return self.wait(self._json(resp, "job_id")["job_id"])
        return self._json(resp, "state")

    def submit(
        self,
        name: str,
        input: Any = None,
        *,
        lease_tag: str | None = None,
        queue: str | None = None,
        priority: int | None = None,
        timeout_s: float | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Queue ``name`` and return the job id at once (``wait`` or ``job`` to follow it)."""
        resp = self._post_job(
            f"/v1/functions/{_segment(name)}/jobs",
            input,
            lease_tag,
            queue,
            priority,
            timeout_s,
            idempotency_key,
        )
        return str(self._json(resp, "job_id")["job_id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{_segment(job_id)}", "state")

    def jobs(self, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params = {"limit": str(limit)}
        if state is not None:  # "" too: the gateway refuses it, by name
            params["state"] = state
        return list(self._call("GET", "/v1/jobs", "jobs", params=params)["jobs"])

    def wait(
        self, job_id: str, timeout_s: float | None = None, poll_s: float = 0.05
    ) -> dict[str, Any]:
        """The job's record once it has ended (``SUCCEEDED``, ``FAILED`` or ``CANCELLED``).
        ``timeout_s``: give up after that long with ``JobNotFinished`` (None: wait until it
        ends; a job may run for a day)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise JobNotFinished(job, timeout_s or 0.0)
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, 1.0)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/jobs/{_segment(job_id)}", "state")

    def logs(self, job_id: str, follow: bool = False) -> httpx.Response:
        """The job's whole log, read once the answer ends (with ``follow``, once the job
        does); ``iter_logs`` hands it over as it arrives."""
        return self._request(
            "GET", f"/v1/jobs/{_segment(job_id)}/logs", params={"follow": "1"} if follow else None
        )

    def iter_logs(self, job_id: str, follow: bool = False) -> Iterator[bytes]:
        """The job's log as it arrives: exactly the bytes the job wrote (decode them as you
        like; a job may write anything). ``follow`` streams a running job's output until
        it ends, with no read timeout (a quiet job may print nothing for minutes)."""
        params = {"follow": "1"} if follow else None
        timeout = httpx.Timeout(self._http.timeout.connect, read=None) if follow else None
        with self._http.stream(
            "GET", f"/v1/jobs/{_segment(job_id)}/logs", params=params,
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        ) as resp:  # fmt: skip
            if resp.status_code >= 400:
                resp.read()
                self._raise(resp)
            if not _is(resp, _LOG_BYTES):  # a page from a wrong URL is not the job's log
                raise UnexpectedAnswer(str(self._http.base_url), resp)
            yield from resp.iter_bytes()

    def pools(self) -> dict[str, Any]:
        return self._call("GET", "/v1/pools", "pools")
