"""The HTTP API (DESIGN.md "The public interface"): Starlette routes, JSON via orjson.

Handlers only authenticate, decode strictly, call the broker and shape the answer; every
``FirepoolError`` is turned into a status and a typed JSON body in one exception handler.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.jobs import Job
from broker.service import Broker, request_digest
from functions.errors import (
    ErrorClass,
    Expired,
    FirepoolError,
    InvalidRequest,
    NotFound,
    TooLarge,
    Unavailable,
    UnknownField,
)
from functions.nesting import MAX_NESTING, nests_deeper
from functions.resources import Resources
from functions.spec import MAX_TIMEOUT_S, FunctionSpec
from gateway.auth import Authenticator, Principal, Role, authenticator_for
from gateway.dashboard.routes import dashboard_routes
from gateway.decoding import Field, decode, string_map
from gateway.errors import error_body, error_headers, http_status, retry_after
from gateway.metrics import CONTENT_TYPE, RequestMetrics, render_metrics
from gateway.openapi import build_openapi, with_pools
from pool_manager.catalog import Catalog
from pool_manager.states import TERMINAL_JOB_STATES, JobState

log = logging.getLogger("firepool.api")
access = logging.getLogger("firepool.access")
CALLER = "firepool.caller"
"""The scope key where ``_principal`` leaves the authenticated caller for ``RequestLog``."""

INVOKE_FIELDS = {
    "input": Field((object,)),
    "lease_tag": Field((str,)),
    "queue": Field((str,), default="default"),
    "priority": Field((int,), default=0),
    "timeout_s": Field((float,)),
    "single_use": Field((bool,), default=False),
}
MAX_TEXT = 255
"""Longest ``lease_tag``, ``queue`` and Idempotency-Key (the job store's String(255))."""
PRIORITY_RANGE = (-(2**31), 2**31 - 1)
"""``priority`` fits the job store's Integer column (and MySQL's INT)."""
MAX_LISTED = 1000
"""Most jobs one ``GET /v1/jobs`` lists."""


def check_invoke(body: dict[str, Any], raw: bytes) -> None:
    """Refuse, naming the field, what the job store or a later hop could not carry: an
    input nested deeper than ``MAX_NESTING``, a priority past 32 bits, a lease tag or queue
    longer than the store's columns, a timeout outside (0, 86400] s. ``raw``: the request
    body ``body`` was decoded from."""
    if body["timeout_s"] is not None and not 0 < body["timeout_s"] <= MAX_TIMEOUT_S:
        raise InvalidRequest(f"timeout_s must be in (0, {MAX_TIMEOUT_S}]", field="timeout_s")
    if nests_deeper(body["input"], text=raw):
        raise InvalidRequest(f"input nests more than {MAX_NESTING} levels deep", field="input")
    low, high = PRIORITY_RANGE
    if not low <= body["priority"] <= high:
        raise InvalidRequest(f"priority must be in [{low}, {high}]", field="priority")
    for name in ("lease_tag", "queue"):
        if body[name] is not None and len(body[name]) > MAX_TEXT:
            raise InvalidRequest(f"{name} must be at most {MAX_TEXT} characters", field=name)


FUNCTION_FIELDS = {
    "name": Field((str,), required=True),
    "sku": Field((str,)),
    "resources": Field((dict,)),
    "package_digest": Field((str,), required=True),
    "entrypoint": Field((str,)),
    "command": Field((list,)),
    "requirements": Field((str,)),
    "env": Field((dict,)),
    "timeout_s": Field((float,), default=300.0),
    "max_retries": Field((int,), default=2),
    "pods": Field((int,), default=1),
    "single_use": Field((bool,), default=False),
}
OPENAPI = build_openapi(
    INVOKE_FIELDS,
    FUNCTION_FIELDS,
    {  # ``check_invoke``'s limits, for clients and fuzzers
        "input": {
            "description": f"any JSON, nested at most {MAX_NESTING} levels, its integers "
            "within 64 bits (signed or unsigned; send wider ones as strings)"
        },
        "lease_tag": {"maxLength": MAX_TEXT},
        "queue": {"maxLength": MAX_TEXT},
        "priority": {"minimum": PRIORITY_RANGE[0], "maximum": PRIORITY_RANGE[1]},
        "timeout_s": {"exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S},
    },
    MAX_LISTED,
)


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


async def body_chunks(request: Request, limit: int) -> AsyncIterator[bytes]:
    """The request body as it arrives, refused with 413 ``TooLarge`` as soon as it passes
    ``limit`` (at once when its ``Content-Length`` says it will)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body is {declared} bytes; the limit is {limit}")
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body is over the limit of {limit} bytes")
        if chunk:
            yield chunk


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused with 413 ``TooLarge`` as soon as it passes ``limit``."""
    return b"".join([chunk async for chunk in body_chunks(request, limit)])


async def _json_body(request: Request) -> bytes:
    return await read_body(request, _broker(request).settings.max_json_bytes)


async def _principal(request: Request, role: Role = Role.INVOKE) -> Principal:
    auth: Authenticator = request.app.state.auth
    principal = await auth.authenticate_async(request.headers.get("authorization"))
    request.scope[CALLER] = principal.caller  # the request log's; never the token
    principal.require(role)
    return principal


Handler = Callable[[Request], Awaitable[Response]]


def queries(*allowed: str) -> Callable[[Handler], Handler]:
    """A route taking only the query parameters ``allowed`` (none if none are named): any
    other is refused as ``UnknownField``, naming it, like an unknown body field, so that
    ``GET /v1/jobs?stat=RUNNING&limt=1`` does not silently list every job."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def checked(request: Request) -> Response:
            for name in request.query_params:
                if name not in allowed:
                    takes = ", ".join(allowed) if allowed else "none"
                    raise UnknownField(
                        f"unknown query parameter {name!r} (this route takes: {takes})",
                        field=name,
                    )
            return await handler(request)

        return checked

    return wrap


def query_switch(request: Request, name: str) -> bool:
    """An on/off query flag: ``1`` or ``true`` on, ``0``, ``false`` or absent off; anything
    else is refused, naming it (a typo must not silently mean off)."""
    value = request.query_params.get(name)
    if value in ("1", "true"):
        return True
    if value is None or value in ("0", "false"):
        return False
    raise InvalidRequest(f"{name} must be 1, true, 0 or false (got {value!r})", field=name)


def _broker(request: Request) -> Broker:
    broker: Broker = request.app.state.broker
    return broker


# -- packages ---------------------------------------------------------------------------
@queries()
async def put_package(request: Request) -> Response:
    broker = _broker(request)
    principal = await _principal(request, Role.DEPLOY)
    digest = request.path_params["sha256"]
    if request.method == "HEAD":  # 200 only to a caller who may use it: no existence oracle
        usable = await broker.may_use_package(digest, principal.caller, principal.is_admin)
        return Response(status_code=200 if usable else 404)
    is_zip = request.headers.get("content-type", "").startswith("application/zip")
    declared = request.headers.get("content-length", "")
    if declared.isdigit():  # refused before the body is read; checked again on its size
        await broker.check_storage_quota(principal.caller, int(declared), digest=digest)
    chunks = body_chunks(request, broker.settings.max_body_bytes)
    size, created = await broker.upload_package(digest, chunks, principal.caller, is_zip)
    return JSONResponse(
        {"digest": digest, "size": size, "created": created},
        status_code=201 if created else 200,
    )


UPLOAD_FIELDS = {"size": Field((int,), required=True)}
COMPLETE_FIELDS = {"ticket": Field((str,), required=True), "etags": Field((list,))}


@queries()
async def authorise_upload(request: Request) -> Response:
    """How to upload a package of ``size`` bytes (``broker.package_uploads``): not at all,
    through ``PUT /v1/packages/{sha256}``, or straight to the object store."""
    broker = _broker(request)
    principal = await _principal(request, Role.DEPLOY)
    size = decode(await _json_body(request), UPLOAD_FIELDS)["size"]
    if size < 0:
        raise InvalidRequest("size must be >= 0", field="size")
    authorised = await broker.authorise_upload(
        request.path_params["sha256"], size, principal.caller, principal.is_admin
    )
    return JSONResponse(authorised.to_json())


@queries()
async def complete_upload(request: Request) -> Response:
    """Verify a direct upload and record its caller as an uploader."""
    broker = _broker(request)
    principal = await _principal(request, Role.DEPLOY)
    body = decode(await _json_body(request), COMPLETE_FIELDS)
    etags = body["etags"] or []
    if not all(isinstance(e, str) for e in etags):
        raise InvalidRequest("etags must be a list of strings", field="etags")
    digest = request.path_params["sha256"]
    size, created = await broker.complete_upload(digest, body["ticket"], etags, principal.caller)
    return JSONResponse(
        {"digest": digest, "size": size, "created": created}, status_code=201 if created else 200
    )


@queries("exp", "sig")
async def get_blob(request: Request) -> Response:
    """Serve a package to a pod; the signed URL is the credential (no bearer token)."""
    broker = _broker(request)
    digest = request.path_params["sha256"]
    try:
        expires = int(request.query_params.get("exp", ""))
    except ValueError:
        raise InvalidRequest("missing or bad exp", field="exp") from None
    blob = await broker.package_blob(digest, expires, request.query_params.get("sig", ""))
    if isinstance(blob, Path):  # sent from the store's own file
        return FileResponse(blob, media_type="application/zip")
    size = blob.seek(0, io.SEEK_END)
    blob.seek(0)
    return StreamingResponse(
        _read_chunks(blob), media_type="application/zip", headers={"Content-Length": str(size)}
    )


def _read_chunks(blob: BinaryIO) -> Iterator[bytes]:
    """``blob`` in 64 KiB pieces, closed at the end (Starlette reads them in a thread)."""
    with blob:
        while chunk := blob.read(1 << 16):
            yield chunk


# -- functions --------------------------------------------------------------------------
async def create_function(request: Request) -> Response:
    broker = _broker(request)
    principal = await _principal(request, Role.DEPLOY)
    body = decode(await _json_body(request), FUNCTION_FIELDS)
    command = body["command"]
    if command is not None and not all(isinstance(c, str) for c in command):
        raise InvalidRequest("command must be a list of strings", field="command")
    if (body["sku"] is None) == (body["resources"] is None):
        raise InvalidRequest("give exactly one of sku (a pool) and resources", field="sku")
    resources = body["resources"]
    spec = FunctionSpec(
        name=body["name"],
        sku=body["sku"] or "",
        resources=Resources.from_json(resources) if resources is not None else None,
        package_digest=body["package_digest"],
        entrypoint=body["entrypoint"],
        command=tuple(command) if command is not None else None,
        requirements_digest=body["requirements"],
        env=string_map("env", body["env"]),
        timeout_s=body["timeout_s"],
        max_retries=body["max_retries"],
        pods=body["pods"],
        single_use=body["single_use"],
        owner=principal.caller,
    )
    stored = await broker.register_function(spec, as_admin=principal.is_admin)
    return JSONResponse(stored.to_json(), status_code=201)


FUNCTION_PRIVATE_FIELDS = ("env", "command", "package_digest", "requirements")
"""What only a function's owner (or an admin) sees of it: its environment holds secrets, its
command may, and its digests name code that is theirs (otherwise an invoke-only token could
read another caller's API token from ``env``)."""


def function_view(spec: FunctionSpec, principal: Principal) -> dict[str, Any]:
    """``spec`` as ``principal`` may see it: whole for its owner or an admin; without
    ``FUNCTION_PRIVATE_FIELDS`` for every other caller, who may still invoke it."""
    data = spec.to_json()
    if principal.caller != spec.owner and not principal.is_admin:
        for key in FUNCTION_PRIVATE_FIELDS:
            del data[key]
    return data


async def list_functions(request: Request) -> Response:
    principal = await _principal(request)
    specs = await _broker(request).list_functions()
    return JSONResponse({"functions": [function_view(s, principal) for s in specs]})


@queries()
async def function_collection(request: Request) -> Response:
    if request.method == "POST":
        return await create_function(request)
    return await list_functions(request)


@queries()
async def function_target(request: Request) -> Response:
    broker = _broker(request)
    name: str = request.path_params["name"]
    if request.method == "DELETE":
        principal = await _principal(request, Role.DEPLOY)
        caller = None if principal.is_admin else principal.caller
        if not await broker.delete_function(name, caller):
            raise NotFound(f"no function named {name!r}")
        return JSONResponse({"deleted": name})
    principal = await _principal(request)
    return JSONResponse(function_view(await broker.latest_function(name), principal))


@queries()
async def invoke_function(request: Request) -> Response:
    return await _invoke(request, request.path_params["name"], sync=True)


@queries()
async def submit_job(request: Request) -> Response:
    return await _invoke(request, request.path_params["name"], sync=False)


async def _invoke(request: Request, name: str, sync: bool) -> Response:
    broker = _broker(request)
    if not broker.accepting:
        raise Unavailable(broker.refusal)
    principal = await _principal(request)
    raw = await _json_body(request)
    body = decode(raw, INVOKE_FIELDS)
    check_invoke(body, raw)
    key = request.headers.get("idempotency-key")
    if key is not None and not 0 < len(key) <= MAX_TEXT:
        raise InvalidRequest(
            f"the Idempotency-Key header must be 1 to {MAX_TEXT} characters",
            field="Idempotency-Key",
        )
    digest = request_digest(name, raw) if key is not None else None
    job, _created = await broker.submit(principal.caller, name, body, key, digest)
    if sync and job.state not in TERMINAL_JOB_STATES:
        wait_s = broker.settings.sync_wait_s
        done = await broker.wait(job.id, wait_s)
        job = done or job
    if sync and job.state in TERMINAL_JOB_STATES:
        return JSONResponse(job.to_public(), status_code=200)
    return JSONResponse(
        {"job_id": job.id, "state": str(job.state)},
        status_code=202,
        headers={"Location": f"/v1/jobs/{job.id}"},
    )


# -- jobs -------------------------------------------------------------------------------
async def _visible_job(request: Request) -> tuple[Broker, Job]:
    broker = _broker(request)
    principal = await _principal(request)
    job = await broker.get_job(request.path_params["job_id"])
    if job is None or (job.caller != principal.caller and not principal.is_admin):
        raise NotFound(f"no job {request.path_params['job_id']}")
    if job.output_expired:
        raise Expired(f"job {job.id} ended {job.state}; its output and logs passed retention")
    return broker, job


@queries()
async def job_route(request: Request) -> Response:
    broker, job = await _visible_job(request)
    if request.method == "DELETE":
        job = await broker.cancel(job)
    return JSONResponse(job.to_public())


@queries("state", "limit")
async def list_jobs(request: Request) -> Response:
    broker = _broker(request)
    principal = await _principal(request)
    state = request.query_params.get("state")
    states = None
    if state is not None:
        try:
            states = [JobState(state.upper())]
        except ValueError:
            raise InvalidRequest(f"unknown state {state!r}", field="state") from None
    caller = None if principal.is_admin else principal.caller
    try:
        limit = int(request.query_params.get("limit", "100"))
    except ValueError:
        raise InvalidRequest("limit must be an integer", field="limit") from None
    if not 1 <= limit <= MAX_LISTED:
        raise InvalidRequest(f"limit must be in [1, {MAX_LISTED}]", field="limit")
    jobs = await broker.list_jobs(caller, states, limit)
    return JSONResponse({"jobs": [j.to_public() for j in jobs]})


@queries("follow")
async def job_logs(request: Request) -> Response:
    """The job's log: live from rank 0's agent while it runs, from the archive afterwards
    (same byte offsets); ``?follow=1`` streams until the job ends."""
    broker, job = await _visible_job(request)
    follow = query_switch(request, "follow")
    if request.method == "HEAD":  # the headers only: a followed log would hold it to the end
        return Response(media_type="application/octet-stream")
    chunks = broker.read_log(job, follow=follow)
    return StreamingResponse(chunks, media_type="application/octet-stream")  # any bytes


# -- operations -------------------------------------------------------------------------
@queries("pods")
async def pools(request: Request) -> Response:
    broker = _broker(request)
    await _principal(request, Role.ADMIN)
    return JSONResponse(broker.pool_report(with_pods=query_switch(request, "pods")))


@queries()
async def healthz(request: Request) -> Response:
    return JSONResponse({"ok": True})


@queries()
async def readyz(request: Request) -> Response:
    ready = _broker(request).ready
    if ready:
        return JSONResponse({"ready": True})
    return JSONResponse(
        {"ready": False}, status_code=503, headers={"Retry-After": retry_after(None)}
    )


@queries()
async def metrics(request: Request) -> Response:
    return Response(render_metrics(_broker(request)), headers={"Content-Type": CONTENT_TYPE})


@queries()
async def openapi(request: Request) -> Response:
    return JSONResponse(served_openapi(request.app))


def served_openapi(app: Starlette) -> dict[str, Any]:
    """The document for the broker's catalog of now: a reload (SIGHUP, a changed ConfigMap)
    swaps the catalog, and the pools the document names follow it. Made once per catalog."""
    catalog = app.state.broker.catalog
    made: tuple[Catalog, dict[str, Any]] | None = app.state.openapi
    if made is None or made[0] is not catalog:
        made = (catalog, with_pools(OPENAPI, catalog))
        app.state.openapi = made
    return made[1]


async def firepool_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FirepoolError)
    return JSONResponse(error_body(exc), status_code=http_status(exc), headers=error_headers(exc))


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own refusals (no such route, a method the route does not take) in the
    API's JSON error form, not Starlette's ``text/plain``."""
    assert isinstance(exc, HTTPException)
    error = {"class": str(ErrorClass.INVALID_REQUEST), "message": exc.detail}
    if exc.status_code == 404:
        error = {"class": str(ErrorClass.NOT_FOUND), "message": f"no route {request.url.path}"}
    elif exc.status_code == 405:
        error["message"] = f"{request.method} is not a method of {request.url.path}"
    return JSONResponse({"error": error}, status_code=exc.status_code, headers=exc.headers)


async def unexpected_error(request: Request, exc: Exception) -> Response:
    """An exception no handler expected, in the API's JSON error form (not a bare 500
    ``Internal Server Error``): a job store that fails (a full disk, a dropped connection)
    is ``Unavailable`` (503: try again), anything else ``InternalError`` (500), logged."""
    if isinstance(exc, SQLAlchemyError):
        log.error("%s %s: the job store failed: %r", request.method, request.url.path, exc)
        error = Unavailable("the job store failed; try again")
        return JSONResponse(
            error_body(error), status_code=http_status(error), headers=error_headers(error)
        )
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    body = {"error": {"class": str(ErrorClass.INTERNAL), "message": "internal error (logged)"}}
    return JSONResponse(body, status_code=500)


class RequestLog:
    """One INFO line on ``firepool.access`` per HTTP request once its answer is sent: method,
    path (never the query: a blob URL's holds its signature), status, milliseconds, and the
    caller once a token was accepted (``-`` before). A plain ASGI wrapper (one closure and
    two clock reads per request); with the logger above INFO it costs one check."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not access.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the server answers for an exception that escapes every handler

        async def sent(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            ms = (time.perf_counter() - start) * 1000
            caller = scope.get(CALLER, "-")
            access.info(
                "%s %s %d %.1f ms %s", scope["method"], scope["path"], status, ms, caller,
                extra={"event": "http_request", "method": scope["method"],
                       "path": scope["path"], "status": status, "ms": round(ms, 1),
                       "caller": caller},
            )  # fmt: skip


def create_app(broker: Broker) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await broker.start()
        try:
            yield
        finally:
            await broker.stop()

    routes = [
        Route("/v1/packages/{sha256}", put_package, methods=["PUT", "HEAD"]),
        Route("/v1/packages/{sha256}/uploads", authorise_upload, methods=["POST"]),
        Route("/v1/packages/{sha256}/uploads:complete", complete_upload, methods=["POST"]),
        Route("/v1/blobs/{sha256}", get_blob, methods=["GET"]),
        Route("/v1/functions", function_collection, methods=["GET", "POST"]),
        Route("/v1/functions/{name}/jobs", submit_job, methods=["POST"]),
        Route("/v1/functions/{name}:invoke", invoke_function, methods=["POST"]),
        Route("/v1/functions/{name}", function_target, methods=["GET", "DELETE"]),
        Route("/v1/jobs", list_jobs, methods=["GET"]),
        Route("/v1/jobs/{job_id}", job_route, methods=["GET", "DELETE"]),
        Route("/v1/jobs/{job_id}/logs", job_logs, methods=["GET"]),
        Route("/v1/pools", pools, methods=["GET"]),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics),
        Route("/openapi.json", openapi),
        *dashboard_routes(),
    ]
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(RequestLog)]
        + ([Middleware(RequestMetrics, broker.telemetry)] if broker.telemetry.enabled else []),
        exception_handlers={
            FirepoolError: firepool_error,
            HTTPException: http_error,
            Exception: unexpected_error,
        },
    )
    app.state.broker = broker
    app.state.openapi = None  # served_openapi makes it for the catalog of the moment
    settings = broker.settings
    app.state.auth = authenticator_for(broker.signing_key, settings)
    return app
