"""The operator's dashboard under ``/dashboard``: server-rendered pages (Jinja2, every value
autoescaped) that refresh their live part by htmx polling.

Every page needs an admin (``session.dashboard_admin``); a page asked for by htmx (its
``HX-Request`` header) answers only its live part (``<page>_live.html``), which the full page
includes. The pages read the broker only through its facade: ``pool_report`` (the numbers of
``GET /v1/pools``), ``get_job``, ``read_log`` and ``views`` (``broker.dashboard_views``).
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from broker.dashboard_views import WINDOW_S, pool_rows
from broker.service import Broker
from functions.errors import FirepoolError, InvalidRequest, NotFound, Unauthorized
from gateway.dashboard import formats
from gateway.dashboard.plot import chart
from gateway.dashboard.session import (
    SECURITY_HEADERS,
    admin_of_token,
    check_same_origin,
    dashboard_admin,
    end_session,
    login_token,
    set_session,
)
from gateway.errors import http_status
from pool_manager.states import TERMINAL_JOB_STATES, JobState

ROOT = "/dashboard"
LOGIN = f"{ROOT}/login"
LOG_TAIL_BYTES = 64 * 1024
"""The most of a job's log its page shows: the end of it."""
MAX_JOBS_LISTED = 1000
STOP_POLLING = 286
"""The status that tells htmx to stop polling (and still show the answer)."""

templates = Environment(
    loader=PackageLoader("gateway.dashboard", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
templates.filters.update(formats.FILTERS)
templates.globals.update(formats.GLOBALS)


def render(request: Request, name: str, status: int = 200, **context: Any) -> HTMLResponse:
    """``name`` rendered, or its live part ``<name>_live.html`` for an htmx request."""
    if request.headers.get("hx-request") == "true" and context.get("live"):
        name = name.removesuffix(".html") + "_live.html"
    context.setdefault("live", False)
    query = request.url.query
    context.setdefault("live_url", request.url.path + (f"?{query}" if query else ""))
    html = templates.get_template(name).render(request=request, root=ROOT, **context)
    return HTMLResponse(html, status_code=status, headers=SECURITY_HEADERS)


Page = Callable[[Request, Broker], Awaitable[Response]]


def page(*queries: str) -> Callable[[Page], Callable[[Request], Awaitable[Response]]]:
    """A dashboard page taking only the query parameters ``queries``: it needs an admin
    (without a token: to the login form; a non-admin token: 403), and a refusal is shown as
    a page with the refusal's status."""

    def wrap(handler: Page) -> Callable[[Request], Awaitable[Response]]:
        @functools.wraps(handler)
        async def run(request: Request) -> Response:
            try:
                await dashboard_admin(request)
                for name in request.query_params:
                    if name not in queries:
                        raise InvalidRequest(f"this page takes no {name!r} parameter", field=name)
                return await handler(request, request.app.state.broker)
            except Unauthorized as exc:
                if request.headers.get("hx-request") == "true":
                    return Response(status_code=401, headers={"HX-Redirect": LOGIN})
                if "authorization" in request.headers or "cookie" in request.headers:
                    return render(request, "login.html", status=401, message=exc.message)
                return RedirectResponse(LOGIN, status_code=303, headers=SECURITY_HEADERS)
            except FirepoolError as exc:
                return render(request, "error.html", status=http_status(exc), error=exc)

        return run

    return wrap


@page()
async def overview(request: Request, broker: Broker) -> Response:
    report = broker.pool_report()
    stats, plot = await broker.views.start_stats()
    return render(
        request,
        "overview.html",
        live=True,
        rows=pool_rows(report, stats),
        window_s=WINDOW_S,
        start_chart=chart(plot.starts, plot.since, plot.until),
        held_charts={
            acc: chart(points, plot.since, plot.until) for acc, points in plot.held.items()
        },
    )


@page()
async def pool_detail(request: Request, broker: Broker) -> Response:
    sku: str = request.path_params["sku"]
    if sku not in broker.catalog.pools:
        raise NotFound(f"no pool named {sku!r}")
    [row] = [r for r in pool_rows(broker.pool_report(), {}) if r.sku == sku]
    pods = await broker.views.pool_pods(sku)
    return render(request, "pool.html", live=True, row=row, pods=pods)


@page("function", "caller", "state", "limit")
async def job_list(request: Request, broker: Broker) -> Response:
    query = request.query_params
    function = query.get("function") or None
    caller = query.get("caller") or None
    state_text = query.get("state") or None
    states = None
    if state_text is not None:
        try:
            states = [JobState(state_text.upper())]
        except ValueError:
            raise InvalidRequest(f"unknown state {state_text!r}", field="state") from None
    try:
        limit = int(query.get("limit") or "100")
    except ValueError:
        raise InvalidRequest("limit must be a whole number", field="limit") from None
    if not 1 <= limit <= MAX_JOBS_LISTED:
        raise InvalidRequest(f"limit must be in [1, {MAX_JOBS_LISTED}]", field="limit")
    jobs = await broker.views.find_jobs(function, caller, states, limit)
    return render(
        request,
        "jobs.html",
        live=True,
        jobs=jobs,
        filters={"function": function or "", "caller": caller or "", "state": state_text or ""},
        states=list(JobState),
        limit=limit,
    )


async def _job(broker: Broker, job_id: str) -> Any:
    job = await broker.get_job(job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    return job


@page()
async def job_detail(request: Request, broker: Broker) -> Response:
    job = await _job(broker, request.path_params["job_id"])
    polled = request.headers.get("hx-request") == "true"
    status = STOP_POLLING if polled and job.state in TERMINAL_JOB_STATES else 200
    return render(request, "job.html", status=status, live=True, job=job)


@page()
async def job_log(request: Request, broker: Broker) -> Response:
    """The end of the job's log as a ``<pre>``; once the job has ended (its log complete),
    answered with ``STOP_POLLING``."""
    job = await _job(broker, request.path_params["job_id"])
    ended = job.state in TERMINAL_JOB_STATES  # read before the log: then the log is whole
    if job.output_expired:
        text, cut = "", False
    else:
        tail = bytearray()
        cut = False
        async for chunk in broker.read_log(job, follow=False):
            tail += chunk
            if len(tail) > LOG_TAIL_BYTES:
                del tail[: len(tail) - LOG_TAIL_BYTES]
                cut = True
        text = tail.decode(errors="replace")
    status = STOP_POLLING if ended else 200
    return render(request, "log.html", status=status, job=job, text=text, cut=cut, ended=ended)


@page()
async def function_list(request: Request, broker: Broker) -> Response:
    uses = await broker.views.function_uses()
    return render(request, "functions.html", uses=uses, window_s=WINDOW_S)


async def login(request: Request) -> Response:
    """The login form (GET), or a token checked and kept in the session cookie (POST)."""
    if request.method == "GET":
        return render(request, "login.html", message=None)
    try:
        check_same_origin(request)
        token = await login_token(request)
        principal = await admin_of_token(request, token)
    except FirepoolError as exc:
        return render(request, "login.html", status=http_status(exc), message=exc.message)
    response = RedirectResponse(f"{ROOT}/", status_code=303, headers=SECURITY_HEADERS)
    set_session(response, request, token, principal)
    return response


async def logout(request: Request) -> Response:
    try:
        check_same_origin(request)
    except FirepoolError as exc:
        return render(request, "error.html", status=http_status(exc), error=exc)
    response = RedirectResponse(LOGIN, status_code=303, headers=SECURITY_HEADERS)
    end_session(response)
    return response


async def to_overview(request: Request) -> Response:
    return RedirectResponse(f"{ROOT}/", status_code=307)


STATIC = Path(__file__).resolve().parent / "static"


def dashboard_routes() -> list[BaseRoute]:
    """The routes to add to the app: ``/dashboard`` and everything under it."""
    pages = [
        Route("/", overview, methods=["GET"]),
        Route("/pools/{sku}", pool_detail, methods=["GET"]),
        Route("/jobs", job_list, methods=["GET"]),
        Route("/jobs/{job_id}", job_detail, methods=["GET"]),
        Route("/jobs/{job_id}/log", job_log, methods=["GET"]),
        Route("/functions", function_list, methods=["GET"]),
        Route("/login", login, methods=["GET", "POST"]),
        Route("/logout", logout, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="dashboard-static"),
    ]
    return [Route(ROOT, to_overview, methods=["GET"]), Mount(ROOT, routes=pages)]
