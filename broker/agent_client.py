"""HTTP client for pod agents (the protocol of docs/architecture.md §1).

One ``broker.agent_wire.AgentWire`` per pod endpoint (unix socket or TCP: keep-alive
connections), created lazily and closed when the pod goes away. Every transport failure
surfaces as ``AgentUnreachable``; the caller decides whether that means the pod is lost.

Every call carries the pod's secret (``pod_runtime.agent_auth``), derived from the client's
``key`` and the pod's name, which the endpoint itself says (``agent_auth.pod_of``). The name
comes from the backend, never from the agent, so an agent cannot obtain another pod's secret by
claiming its name; a pod IP reused by another pod gets a secret its agent does not hold.

An attempt's answer may carry its whole (small) log (``log``: ``pod_runtime.agent_http``'s
``INLINE_LOG_BYTES``); the client keeps it, taken out of the answer, and ``logs`` serves it
from there instead of asking the agent (the same bytes: the agent fixes an ended attempt's
log), until ``ack``, ``forget`` or ``MAX_KEPT_LOGS`` newer ones drop it; a later read asks the
agent, which keeps the log until acknowledged.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, NamedTuple

import orjson

from broker.agent_wire import AgentWire
from pod_runtime.agent_auth import bearer, pod_of, pod_secret


class AgentUnreachable(Exception):
    """The agent did not answer (connection refused, reset, timed out)."""


class LogChunk(NamedTuple):
    """Bytes ``[offset - len(data), offset)`` of an attempt's log."""

    data: bytes
    offset: int
    """The byte offset after ``data``: where the next read starts."""
    done: bool
    """The attempt has ended and nothing is left past ``offset``."""


MAX_INLINE_LOG_BYTES = 64 * 1024
"""The largest inline log kept (``pod_runtime.agent_http.INLINE_LOG_BYTES``)."""
MAX_KEPT_LOGS = 1024
"""Most inline logs kept for ``logs`` at once; the oldest goes first."""


class AgentClient:
    """Talks to pod agents. Use from the event loop only. ``key``
    (``pod_runtime.agent_auth.agent_key``): the key pod secrets derive from; None sends no
    secret (agents started without one)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._wires: dict[str, AgentWire] = {}
        self._key = key
        self._logs: dict[tuple[str, str], LogChunk] = {}
        """Inline logs by ``(endpoint, attempt id)``: each the whole log of an ended attempt."""

    def _keep_log(self, endpoint: str, attempt_id: str, body: dict[str, Any]) -> None:
        """Take an answer's inline log out of ``body`` and keep it for ``logs``."""
        text = body.pop("log", None)
        if not isinstance(text, str):
            return
        try:
            data = base64.b64decode(text, validate=True)
        except binascii.Error:
            return  # a malformed one: ``logs`` asks the agent
        if len(data) > MAX_INLINE_LOG_BYTES:
            return  # not what an agent inlines: ``logs`` asks the agent
        if len(self._logs) >= MAX_KEPT_LOGS:
            self._logs.pop(next(iter(self._logs)))
        self._logs[(endpoint, attempt_id)] = LogChunk(data, len(data), True)

    def _wire(self, endpoint: str) -> AgentWire:
        wire = self._wires.get(endpoint)
        if wire is None:
            headers: dict[str, str] = {}
            pod = pod_of(endpoint)
            if self._key is not None and pod is not None:
                headers = bearer(pod_secret(self._key, pod))
            wire = self._wires[endpoint] = AgentWire(endpoint, headers)
        return wire

    async def _call(
        self, method: str, endpoint: str, path: str, *, body: Any = None, timeout: float = 10.0
    ) -> tuple[int, Any]:
        wire = self._wire(endpoint)
        data = orjson.dumps(body) if body is not None else None
        try:
            status, raw = await wire.request(method, path, data, timeout)
            return status, (orjson.loads(raw) if raw else None)
        except (TimeoutError, OSError, ValueError) as exc:  # orjson's JSONDecodeError too
            # Not the endpoint: the message may reach a caller (a PodLost error), and a local
            # pod's endpoint is a path inside the broker's state directory.
            raise AgentUnreachable(f"{method} {path.partition('?')[0]}: {exc!r}") from exc

    async def health(self, endpoint: str, timeout: float = 2.0) -> dict[str, Any] | None:
        """The agent's report, or None: no answer, or it did not take this client's secret
        (a pod of another broker's key answers a probe, but nothing else)."""
        try:
            status, body = await self._call("GET", endpoint, "/healthz", timeout=timeout)
        except AgentUnreachable:
            return None
        if status != 200 or not isinstance(body, dict) or body.get("authorized") is False:
            return None  # the agent did not take our secret: we cannot use this pod
        return body

    async def start(
        self, endpoint: str, spec: dict[str, Any], timeout: float
    ) -> tuple[int, dict[str, Any]]:
        status, body = await self._call("POST", endpoint, "/attempts", body=spec, timeout=timeout)
        if not isinstance(body, dict):
            return status, {}
        if status == 200:
            self._keep_log(endpoint, str(spec.get("attempt_id")), body)
        return status, body

    async def result(
        self, endpoint: str, attempt_id: str, wait_s: float = 0.0
    ) -> dict[str, Any] | None:
        status, body = await self._call(
            "GET", endpoint, f"/attempts/{attempt_id}?wait={wait_s}", timeout=wait_s + 10.0
        )
        if status == 404:
            return None
        if status != 200 or not isinstance(body, dict):
            raise AgentUnreachable(f"its result answered HTTP {status}")
        self._keep_log(endpoint, attempt_id, body)
        return body

    async def cancel(self, endpoint: str, attempt_id: str) -> None:
        await self._call("DELETE", endpoint, f"/attempts/{attempt_id}")

    async def ack(self, endpoint: str, attempt_id: str) -> None:
        self._logs.pop((endpoint, attempt_id), None)
        await self._call("DELETE", endpoint, f"/attempts/{attempt_id}/result")

    async def logs(self, endpoint: str, attempt_id: str, offset: int = 0) -> LogChunk | None:
        """Up to 1 MiB of the attempt's log from byte ``offset``, exactly the bytes the job
        wrote (sent base64, so neither undecodable bytes nor a UTF-8 sequence split by the
        read change them or their offsets); None for an unknown attempt or a malformed answer.
        An inline log kept from the attempt's answer is served without asking the agent."""
        kept = self._logs.get((endpoint, attempt_id))
        if kept is not None and 0 <= offset <= kept.offset:
            return LogChunk(kept.data[offset:], kept.offset, True)
        status, body = await self._call(
            "GET", endpoint, f"/attempts/{attempt_id}/logs?offset={offset}&encoding=base64"
        )
        if status != 200 or not isinstance(body, dict):
            return None
        after, text = body.get("offset"), body.get("data")
        if not isinstance(text, str) or type(after) is not int:
            return None
        try:
            data = base64.b64decode(text, validate=True)
        except binascii.Error:
            return None
        done = bool(body.get("done"))
        if after != offset + len(data):  # not the bytes from ``offset``
            # (an offset past the log's end is answered with no bytes: nothing there yet)
            return None if data else LogChunk(b"", offset, done)
        return LogChunk(data, after, done)

    async def reset(self, endpoint: str, timeout: float = 30.0) -> dict[str, Any]:
        status, body = await self._call("POST", endpoint, "/reset", body={}, timeout=timeout)
        if status != 200 or not isinstance(body, dict):
            return {"clean": False, "reason": f"reset answered HTTP {status}"}
        return body

    async def forget(self, endpoint: str) -> None:
        for key in [k for k in self._logs if k[0] == endpoint]:
            del self._logs[key]
        wire = self._wires.pop(endpoint, None)
        if wire is not None:
            wire.close()

    async def close(self) -> None:
        for wire in self._wires.values():
            wire.close()
        self._wires.clear()
