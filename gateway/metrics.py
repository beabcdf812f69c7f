"""``GET /metrics`` and the HTTP request metrics, over the broker's own registry.

The exposition is prometheus_client's (it escapes label values); the registry is the
broker's (``broker.telemetry``: event metrics, and the state gauges
``broker.state_metrics`` computes at scrape time). ``RequestMetrics`` counts each request
under its route's template (``/v1/jobs/{job_id}``, never the job id itself, so the series
stay few) and times it to the start of its answer.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.telemetry import Telemetry

if TYPE_CHECKING:
    from broker.service import Broker

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The text exposition format's media type, version included."""
UNMATCHED = "unmatched"
"""The route label of a request no route took (a 404): one series, whatever the path."""


def render_metrics(broker: Broker) -> bytes:
    """Every metric of ``broker``'s registry in the Prometheus text format."""
    return generate_latest(broker.telemetry.registry)


def route_template(scope: Scope) -> str:
    """The template of the route that took the request (set by Starlette's router)."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class RequestMetrics:
    """Counts every HTTP request by route template, method and status, and times it from its
    arrival to its answer's start (``Telemetry.http_request``). A streamed answer (a followed
    log) is counted when it starts: its length is the job's, not the gateway's."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        counted = False

        async def sent(message: Message) -> None:
            nonlocal counted
            if message["type"] == "http.response.start" and not counted:
                counted = True
                self.telemetry.http_request(
                    route_template(scope), scope["method"], message["status"],
                    time.perf_counter() - start,
                )  # fmt: skip
            await send(message)

        try:
            await self.app(scope, receive, sent)
        finally:
            if not counted:  # an exception escaped every handler: the server answers 500
                self.telemetry.http_request(
                    route_template(scope), scope["method"], 500, time.perf_counter() - start
                )
