"""Who may call a pod agent: the broker that made the pod, and nothing else.

Each pod has a secret of its own, given to its agent at start in the environment variable
``SECRET_ENV`` (a local pod's launcher sets it; a Kubernetes pod reads it from its own Secret
through ``secretKeyRef``). Every call carries it as ``Authorization: Bearer <secret>``; the
agent answers any other call 401. ``GET /healthz`` is the one route that answers without it,
and then says only the pod's name and that it is up (what a kubelet's readiness probe, which
cannot carry a per-pod secret, needs); with the secret it gives the full report.

The broker does not store secrets: a pod's is ``pod_secret(key, pod_name)``, an HMAC of the
pod's name under a key derived from the broker's signing key, so a restarted broker (same
key) can call every pod it recovers, and a job that reads its own pod's secret learns nothing
about another pod's.

``FIREPOOL_AGENT_*`` variables never reach a job's environment (``pod_runtime.jobenv``).
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import PurePosixPath
from typing import Any

from aiohttp import web

SECRET_ENV = "FIREPOOL_AGENT_SECRET"
"""Where the agent reads its secret."""
OPEN_PATHS = frozenset({"/healthz"})
"""Routes answered without the secret (with less in them: ``Agent.healthz``)."""
AUTHORIZED = web.RequestKey("authorized", bool)
"""Set on every request: whether it carried the secret."""


def agent_key(signing_key: bytes) -> bytes:
    """The key pod secrets are derived from, itself derived from the broker's signing key
    (so neither can be computed from the other's uses)."""
    return hashlib.sha256(b"agent-secret|" + signing_key).digest()


def pod_secret(key: bytes, pod_name: str) -> str:
    """Pod ``pod_name``'s secret under ``key`` (``agent_key``): 64 hex digits."""
    return hmac.new(key, b"pod|" + pod_name.encode(), hashlib.sha256).hexdigest()


def tcp_endpoint(host: str, port: int, pod_name: str) -> str:
    """The endpoint of pod ``pod_name``'s agent listening on ``host:port``."""
    return f"tcp:{host}:{port}#{pod_name}"


def pod_of(endpoint: str) -> str | None:
    """The pod an agent endpoint belongs to: ``tcp:HOST:PORT#NAME`` names it; a local pod's
    unix socket lives in its own directory, ``<root>/<name>/<socket>``. None for a TCP
    endpoint without a name."""
    if endpoint.startswith("unix:"):
        return PurePosixPath(endpoint[5:]).parent.name or None
    _, sep, name = endpoint.partition("#")
    return name if sep and name else None


def bearer(secret: str) -> dict[str, str]:
    """The header every agent call carries."""
    return {"Authorization": f"Bearer {secret}"}


def authorized(request: web.Request, secret: str | None) -> bool:
    """Whether ``request`` carries ``secret`` (always, for an agent with none)."""
    if secret is None:
        return True
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return scheme == "Bearer" and hmac.compare_digest(given.encode(), secret.encode())


def auth_middleware(secret: str | None) -> Any:
    """An aiohttp middleware answering 401 to a call without ``secret`` (``OPEN_PATHS``
    excepted: the handler sees ``request[AUTHORIZED]`` and answers less)."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        ok = authorized(request, secret)
        request[AUTHORIZED] = ok
        if not ok and request.path not in OPEN_PATHS:
            return web.json_response(
                {"error": {"class": "Unauthorized", "message": "no valid agent secret"}},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        response: web.StreamResponse = await handler(request)
        return response

    return check
