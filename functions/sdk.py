"""Python SDK: deploy packages and functions, call them, follow their jobs.

    from functions.sdk import Client
    with Client("http://127.0.0.1:8080", token) as fp:
        fp.deploy("examples/functions/verifier")   # its firepool.toml says the rest
        verify = fp.function("verify")
        verdict = verify.invoke({"solution": "...", "tests": "..."}, tag="episode-1")
        for verdict in verify.map(candidates, concurrency=16):
            ...

``AsyncClient`` (``functions.client.aio``, on aiohttp) has the same surface with ``await``
and ``async for``. ``Client.function(name)`` is a ``FunctionHandle``: ``invoke`` returns the
output or raises the job's typed error (``FunctionError``, ``JobTimeout``...; see
``functions.client.errors``), ``submit`` returns a ``Job``, ``map`` yields outputs in input
order. Each call carries an Idempotency-Key made once and reused on its retries
(``functions.client.retrying``), so a call sent again after a dropped connection is the
same job. docs/sdk.md has the whole surface.

The lower-level methods (``invoke(name, ...)``, ``submit``, ``job``, ``wait``...) send each
request once and return job records; every non-2xx answer raises ``ApiError`` carrying the
server's typed error class, and an answer that is not the API's at all (an HTML page from a
wrong URL) raises ``UnexpectedAnswer``. The client keeps one HTTP connection pool, safe to
share between threads; use it as a context manager or call ``close()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn

import httpx
import orjson

from functions.client.errors import (
    ApiError,
    ClientError,
    DependencyInstallFailed,
    FunctionError,
    FunctionNotFound,
    JobCancelled,
    JobFailed,
    JobNotFinished,
    JobTimeout,
    NonZeroExit,
    OutOfMemory,
    PodLost,
    PoolExhausted,
    UnexpectedAnswer,
    api_error,
)
from functions.client.handles import FunctionHandle, Job
from functions.client.retrying import NO_RETRY, RetryPolicy, run
from functions.client.wire import TERMINAL, check_key, job_request, json_body, segment
from functions.deploy_config import load_deploy_config
from functions.errors import InvalidRequest
from functions.package_transfer import send_package
from functions.packaging import package_file, sha256_hex

if TYPE_CHECKING:
    from functions.client.aio import AsyncClient

__all__ = [
    "NO_RETRY",
    "ApiError",
    "AsyncClient",
    "Client",
    "ClientError",
    "DependencyInstallFailed",
    "FunctionError",
    "FunctionHandle",
    "FunctionNotFound",
    "Job",
    "JobCancelled",
    "JobFailed",
    "JobNotFinished",
    "JobTimeout",
    "NonZeroExit",
    "OutOfMemory",
    "PodLost",
    "PoolExhausted",
    "RetryPolicy",
    "UnexpectedAnswer",
]

_JSON = "application/json"
_LOG_BYTES = "application/octet-stream"
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (httpx.TransportError,)
"""What a request that got no whole answer raises (refused, reset, cut mid-answer)."""
Progress = Callable[[str, int], Callable[[int], None]]
"""``progress(label, total)`` -> an ``advance(n)`` callback: a deploy's progress display."""


def _is(resp: httpx.Response, media_type: str) -> bool:
    return resp.headers.get("content-type", "").partition(";")[0].strip() == media_type


class Client:
    """A synchronous client. ``retry``: how ``function(name)``'s calls and ``Job``s resend
    (``RetryPolicy()``: 120 s in all; ``NO_RETRY``: once); the lower-level methods never
    resend."""

    def __init__(
        self,
        url: str,
        token: str,
        timeout: float = 120.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if not token.isascii() or not token.isprintable():
            raise InvalidRequest("the token has characters no HTTP header can carry")
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            timeout=timeout,
            headers={"Authorization": f"Bearer {token}"},
        )
        self.retry = retry if retry is not None else RetryPolicy()
        self._retrying = self.retry.retrying(TRANSPORT_ERRORS)
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
            content = json_body(json)
        if content is not None and method == "POST":
            headers = {**(headers or {}), "Content-Type": _JSON}
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
            raise self._unexpected(resp)
        return body

    def _unexpected(self, resp: httpx.Response) -> UnexpectedAnswer:
        content_type = resp.headers.get("content-type", "")
        return UnexpectedAnswer(str(self._http.base_url), resp.status_code, content_type)

    def _raise(self, resp: httpx.Response) -> NoReturn:
        raise api_error(
            str(self._http.base_url),
            resp.status_code,
            resp.headers.get("content-type", ""),
            resp.content,
            resp.headers.get("retry-after"),
        )

    def _retried(self, method: str, path: str, key: str, **kwargs: Any) -> dict[str, Any]:
        """``_call``, sent again as ``self.retry`` says: only for requests that are safe to
        repeat (reads, cancels, and posts that carry an Idempotency-Key)."""
        return run(self._retrying, lambda: self._call(method, path, key, **kwargs))

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
        self,
        file: BinaryIO,
        digest: str,
        size: int,
        content_type: str = "application/zip",
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """``upload`` for a file of ``size`` bytes whose sha256 is ``digest``: streamed from
        its start in chunks with a known Content-Length, never held whole. Returns the bytes
        sent: 0 when the gateway already had them. ``progress(n)`` after each chunk sent."""

        return self._upload(digest, size, file, content_type, progress)

    def _upload(
        self,
        digest: str,
        size: int,
        content: bytes | BinaryIO,
        content_type: str,
        progress: Callable[[int], None] | None = None,
    ) -> int:
        """The one place a package's bytes leave, as the broker directs
        (``functions.package_transfer.send_package``): none when it already has ``digest``
        from this caller, else all ``size`` of them, through the broker or straight to the
        object store. Returns the bytes sent."""
        segment(digest)  # refuses a digest that would walk to another route
        sent = send_package(self._http, self._raise, digest, size, content, content_type, progress)
        self.bytes_uploaded += sent.bytes_sent
        return sent.bytes_sent

    def deploy(
        self,
        directory: str | Path,
        *,
        name: str | None = None,
        sku: str | None = None,
        resources: dict[str, Any] | None = None,
        entrypoint: str | None = None,
        command: list[str] | None = None,
        requirements: str | Path | None = None,
        env: dict[str, str] | None = None,
        timeout_s: float | None = None,
        max_retries: int | None = None,
        pods: int | None = None,
        single_use: bool | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Package ``directory`` (less what its ``.firepoolignore`` names), upload it unless
        the gateway has it, and register a version. ``directory/firepool.toml`` gives every
        argument left None (``functions.deploy_config``); the arguments given override it.
        Returns the registered version, with ``uploaded_bytes`` (0: the package was there).
        ``progress``: a display of packing (files) and uploading (bytes)."""
        root = Path(directory)
        config = load_deploy_config(root).override(
            name=name, pool=sku, resources=resources, entrypoint=entrypoint, command=command,
            requirements=requirements, env=env, timeout_s=timeout_s, max_retries=max_retries,
            pods=pods, single_use=single_use,
        )  # fmt: skip
        body = config.registration()
        with package_file(root, _bar(progress, "packing", None)) as package:
            sent = self.upload_file(
                package.file,
                package.digest,
                package.size,
                progress=_bar(progress, "uploading", package.size),
            )
        body["package_digest"] = package.digest
        if config.requirements is not None:
            body["requirements"] = self.upload(Path(config.requirements).read_bytes(), "text/plain")
        version = self._call("POST", "/v1/functions", "version", json=body)
        return {**version, "uploaded_bytes": sent}

    def functions(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/functions", "functions")["functions"])

    def function(self, name: str) -> FunctionHandle:
        """A handle to call ``name`` (its latest version at each call): no request yet."""
        segment(name)
        return FunctionHandle(self, name)

    def describe_function(self, name: str) -> dict[str, Any]:
        """The latest version of ``name``: its pool, digests, timeout..."""
        return self._call("GET", f"/v1/functions/{segment(name)}", "version")

    def delete_function(self, name: str) -> dict[str, Any]:
        """Hide every version of ``name``: calls to it then answer ``NotFound``."""
        return self._call("DELETE", f"/v1/functions/{segment(name)}", "deleted")

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
        content = job_request(input, lease_tag, queue, priority, timeout_s)
        headers = None
        if idempotency_key is not None:  # "" too: the gateway refuses it, by name
            headers = {"Idempotency-Key": check_key(idempotency_key)}
        return self._request("POST", path, content=content, headers=headers)

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
            f"/v1/functions/{segment(name)}:invoke",
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
            f"/v1/functions/{segment(name)}/jobs",
            input,
            lease_tag,
            queue,
            priority,
            timeout_s,
            idempotency_key,
        )
        return str(self._json(resp, "job_id")["job_id"])

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{segment(job_id)}", "state")

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
        return self._wait(job_id, timeout_s, poll_s, self.job)

    def _wait(
        self,
        job_id: str,
        timeout_s: float | None,
        poll_s: float,
        read: Callable[[str], dict[str, Any]],
    ) -> dict[str, Any]:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = read(job_id)
            if job["state"] in TERMINAL:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise JobNotFinished(job, timeout_s or 0.0)
            time.sleep(poll_s)
            poll_s = min(poll_s * 1.5, 1.0)

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/jobs/{segment(job_id)}", "state")

    def logs(self, job_id: str, follow: bool = False) -> httpx.Response:
        """The job's whole log, read once the answer ends (with ``follow``, once the job
        does); ``iter_logs`` hands it over as it arrives."""
        return self._request(
            "GET", f"/v1/jobs/{segment(job_id)}/logs", params={"follow": "1"} if follow else None
        )

    def iter_logs(self, job_id: str, follow: bool = False) -> Iterator[bytes]:
        """The job's log as it arrives: exactly the bytes the job wrote (decode them as you
        like; a job may write anything). ``follow`` streams a running job's output until
        it ends, with no read timeout (a quiet job may print nothing for minutes)."""
        params = {"follow": "1"} if follow else None
        timeout = httpx.Timeout(self._http.timeout.connect, read=None) if follow else None
        with self._http.stream(
            "GET", f"/v1/jobs/{segment(job_id)}/logs", params=params,
            timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
        ) as resp:  # fmt: skip
            if resp.status_code >= 400:
                resp.read()
                self._raise(resp)
            if not _is(resp, _LOG_BYTES):  # a page from a wrong URL is not the job's log
                raise self._unexpected(resp)
            yield from resp.iter_bytes()

    def pools(self) -> dict[str, Any]:
        return self._call("GET", "/v1/pools", "pools")


def _bar(progress: Progress | None, label: str, total: int | None) -> Callable[[int], None] | None:
    return None if progress is None else progress(label, total or 0)


def __getattr__(name: str) -> Any:
    """``AsyncClient`` from ``functions.client.aio``, imported (with aiohttp) on first use:
    the sync client and the CLI do without aiohttp's import time."""
    if name == "AsyncClient":
        from functions.client.aio import AsyncClient

        return AsyncClient
    raise AttributeError(name)
