"""The pod agent protocol's HTTP layer (docs/architecture.md §1), one piece for every agent:
the real one (``pod_runtime.agent.Agent``) and the fake pod backend's in-process one
(``pool_manager.backends.fake_pod.FakePod``), so the fake speaks exactly the real protocol.

``AgentRoutes`` holds the attempt table and every route; a subclass says how an attempt is
made (``new_attempt``), run (``run``) and killed (``kill``), how much of a log is served
(``ended_log_size``, ``live_log_size``: the real agent caps logs, the fake does not), what a
reset wipes (``wipe``) and what ``/healthz`` reports (``healthz``).

Concurrency: single event loop. At most one attempt runs at a time (a second POST /attempts
answers 409); ``_lock`` serialises starting an attempt with a reset, so a reset never races a
start. Results (and their logs) are kept until the broker acknowledges them with
``DELETE /attempts/{id}/result``. A re-POST of a known attempt id returns that attempt instead
of running it twice (the broker may retry a POST whose answer it lost).
"""

from __future__ import annotations

import abc
import asyncio
import base64
import contextlib
import os
import shutil
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO, Generic, TypeVar

import orjson
from aiohttp import web

from functions.errors import Conflict, ErrorClass, FirepoolError, InvalidRequest, NotFound
from pod_runtime.agent_auth import auth_middleware
from pod_runtime.protocol import AttemptResult, AttemptSpec, AttemptState, decode_spec, json_safe
from pod_runtime.reset import INLINE_ENTRIES, entries_within

LOG_CHUNK = 1 << 20
"""The most log bytes one ``GET /attempts/{id}/logs`` answers."""
MAX_WAIT_S = 600.0
"""The longest long poll ``GET /attempts/{id}?wait=S`` holds; a longer ``wait`` is cut to it."""
CANCEL_WAIT_S = 10.0
EARLY_CANCELS_KEPT = 256
"""Cancels of attempts not yet started that an agent remembers (``cancel_attempt``)."""
"""How long ``DELETE /attempts/{id}`` waits for the killed attempt to end before answering."""
INLINE_LOG_BYTES = 64 * 1024
"""An ended attempt's whole log, when its served size is at most this, rides along in the
attempt's answer (``log``, base64): the broker archives it without a ``GET .../logs``."""
MAX_BODY_BYTES = 64 * 1024 * 1024
"""The largest request body served (an attempt's inline input)."""
HTTP_STATUS = {
    ErrorClass.UNKNOWN_FIELD: 400,
    ErrorClass.INVALID_REQUEST: 400,
    ErrorClass.NOT_FOUND: 404,
    ErrorClass.CONFLICT: 409,
}


def respond(body: Any, status: int = 200) -> web.Response:
    """Every answer is JSON: a string orjson refuses (a file name that is not UTF-8, in a
    reset's reason or an error message) is sent escaped instead (``protocol.safe_text``)."""
    try:
        data = orjson.dumps(body)
    except orjson.JSONEncodeError:
        data = orjson.dumps(json_safe(body))
    return web.Response(body=data, status=status, content_type="application/json")


def error_response(exc: FirepoolError) -> web.Response:
    return respond({"error": exc.to_json()}, HTTP_STATUS.get(exc.error_class, 500))


@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except FirepoolError as exc:
        return error_response(exc)


def reset_wipe(raw: bytes) -> list[str]:
    """The paths a ``POST /reset`` body (``{wipe: [paths]}``, or empty) asks to wipe."""
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict) or set(body) - {"wipe"}:
        raise InvalidRequest("reset body is {wipe: [paths]}", field="wipe")
    wipe = body.get("wipe") or []
    if not isinstance(wipe, list) or not all(isinstance(p, str) for p in wipe):
        raise InvalidRequest("wipe must be a list of paths", field="wipe")
    return wipe


def utf8_boundary(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:
            needed = 2 if byte >= 0xC0 else 1
            needed = 3 if byte >= 0xE0 else needed
            needed = 4 if byte >= 0xF0 else needed
            return len(data) if needed <= back else len(data) - back
    return len(data)


@dataclass(slots=True)
class AgentAttempt:
    """What every agent keeps of an attempt, and what the routes read: its spec, its files
    (``dir``: the log and what the job writes), its result and its end. Each agent's attempt
    adds what its runner needs."""

    spec: AttemptSpec
    dir: Path
    result: AttemptResult
    done: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    @property
    def log(self) -> Path:
        return self.dir / "log"


A = TypeVar("A", bound=AgentAttempt)


class AgentRoutes(abc.ABC, Generic[A]):
    """The attempts kept until acknowledged, the attempt running now, and the routes."""

    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret
        """What every call but ``GET /healthz`` must carry (``pod_runtime.agent_auth``); None:
        nothing (an in-process fake pod)."""
        self.attempts: dict[str, A] = {}
        self.current: A | None = None
        self._lock = asyncio.Lock()
        self._early_cancels: dict[str, None] = {}
        """Attempts cancelled before this agent knew them (the broker's DELETE overtook its
        POST), oldest first, at most ``EARLY_CANCELS_KEPT``: such an attempt is cancelled as
        it starts, so a cancel is never lost to the race."""

    # What an agent supplies.

    @abc.abstractmethod
    async def healthz(self, request: web.Request) -> web.Response:
        """``GET /healthz``: the pod, its role, whether it is busy, the attempts kept."""

    @abc.abstractmethod
    def new_attempt(self, spec: AttemptSpec) -> A:
        """A new attempt for ``spec``, its directory and empty log made (under ``_lock``)."""

    @abc.abstractmethod
    def run(self, attempt: A) -> Coroutine[Any, Any, None]:
        """The attempt's work, run as its task: ends it with a result, never raises."""

    @abc.abstractmethod
    async def kill(self, attempt: A) -> None:
        """Cancel ``attempt``: it ends ``cancelled`` soon (a no-op once it has ended)."""

    def ended_log_size(self, attempt: A, done: bool) -> int | None:
        """How much of the log is served, fixed once the attempt ended; None: the log as it
        is now (``live_log_size``). No cap: None."""
        return None

    def live_log_size(self, log: BinaryIO, size: int) -> int:
        """How much of a log of ``size`` bytes, still written, is served. No cap: all."""
        return size

    @abc.abstractmethod
    async def wipe(self, paths: list[str]) -> dict[str, Any]:
        """Reset the pod (nothing runs; under ``_lock``); the report ``POST /reset`` answers."""

    # The protocol.

    def _get(self, request: web.Request) -> A:
        attempt = self.attempts.get(request.match_info["id"])
        if attempt is None:
            raise NotFound(f"unknown attempt {request.match_info['id']}")
        return attempt

    async def post_attempt(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"body is not JSON: {exc}") from exc
        spec = decode_spec(body)
        attempt = await self.start_attempt(spec)
        if not spec.wait:
            return respond({"attempt_id": spec.attempt_id}, 202)
        await attempt.done.wait()
        return respond(self.answer(attempt))

    def answer(self, attempt: A) -> dict[str, Any]:
        """The attempt's result; once it ended, with its whole log (``log``, base64: the
        bytes ``GET .../logs?encoding=base64`` serves from offset 0) when the log's served
        size is fixed (``ended_log_size``) and at most ``INLINE_LOG_BYTES``."""
        body = attempt.result.to_json()
        if not attempt.done.is_set():
            return body
        size = self.ended_log_size(attempt, True)
        if size is None or size > INLINE_LOG_BYTES:
            return body
        try:
            with attempt.log.open("rb") as log:
                data = log.read(size)
        except FileNotFoundError:
            data = b""
        body["log"] = base64.b64encode(data).decode("ascii")
        return body

    async def start_attempt(self, spec: AttemptSpec) -> A:
        """The attempt ``spec`` names, started now unless it already exists (a retried POST
        is idempotent). Raises ``Conflict`` if another attempt is running."""
        early = False
        async with self._lock:
            attempt = self.attempts.get(spec.attempt_id)
            if attempt is None:
                if self.current is not None:
                    raise Conflict(f"pod is busy with {self.current.spec.attempt_id}")
                attempt = self.new_attempt(spec)
                self.attempts[spec.attempt_id] = attempt
                self.current = attempt
                attempt.task = asyncio.create_task(self.run(attempt))
                attempt.task.add_done_callback(partial(self._settle, attempt))
                early = self._early_cancels.pop(spec.attempt_id, 0) is None
        if early:
            await self.kill(attempt)  # before its first step: settled, never run
        return attempt

    def _settle(self, attempt: A, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step never runs its body, ``finally`` included
        (a cancel that lands in the same loop iteration as the start): settle the attempt
        here, or its waiters and the pod's next reset would wait on it forever."""
        if not attempt.done.is_set():
            attempt.result.state = AttemptState.CANCELLED
            attempt.result.fail(ErrorClass.CANCELLED, "cancelled before the job started")
            attempt.result.finished = time.time()
            attempt.done.set()
        if self.current is attempt:
            self.current = None

    async def get_attempt(self, request: web.Request) -> web.Response:
        attempt = self._get(request)
        try:
            wait_s = min(float(request.query.get("wait", "0")), MAX_WAIT_S)
        except ValueError as exc:
            raise InvalidRequest("wait must be a number of seconds", field="wait") from exc
        if wait_s > 0 and not attempt.done.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(attempt.done.wait(), wait_s)
        return respond(self.answer(attempt))

    async def cancel_attempt(self, request: web.Request) -> web.Response:
        attempt_id = request.match_info["id"]
        if attempt_id not in self.attempts:  # not started yet: cancelled when it comes
            self._early_cancels[attempt_id] = None
            if len(self._early_cancels) > EARLY_CANCELS_KEPT:
                del self._early_cancels[next(iter(self._early_cancels))]
        attempt = self._get(request)
        await self.kill(attempt)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(attempt.done.wait(), CANCEL_WAIT_S)
        return respond(attempt.result.to_json())

    async def ack_attempt(self, request: web.Request) -> web.Response:
        attempt = self._get(request)
        if not attempt.done.is_set():
            raise Conflict(f"attempt {attempt.spec.attempt_id} is still running")
        del self.attempts[attempt.spec.attempt_id]
        if entries_within([attempt.dir], INLINE_ENTRIES):  # its log, input and result
            shutil.rmtree(attempt.dir, True)
        else:  # a job that filled its ``out`` directory: off the event loop
            await asyncio.to_thread(shutil.rmtree, attempt.dir, True)
        return respond({"attempt_id": attempt.spec.attempt_id, "acknowledged": True})

    async def logs(self, request: web.Request) -> web.Response:
        attempt = self._get(request)
        try:
            offset = max(int(request.query.get("offset", "0")), 0)
        except ValueError as exc:
            raise InvalidRequest("offset must be an integer", field="offset") from exc
        encoding = request.query.get("encoding", "text")
        if encoding not in ("text", "base64"):
            raise InvalidRequest("encoding must be text or base64", field="encoding")
        done = attempt.done.is_set()  # before the read: a log read after it is complete
        size = self.ended_log_size(attempt, done)
        try:
            with attempt.log.open("rb") as log:
                if size is None:
                    size = self.live_log_size(log, os.fstat(log.fileno()).st_size)
                start = min(offset, size)
                log.seek(start)
                data = log.read(min(LOG_CHUNK, size - start))
        except FileNotFoundError:
            size, data = 0, b""
        if encoding == "base64":  # the log's own bytes, whatever the job wrote
            cut, text = len(data), base64.b64encode(data).decode("ascii")
        else:
            cut = utf8_boundary(data) if len(data) == LOG_CHUNK else len(data)
            text = data[:cut].decode("utf-8", "replace")
        new_offset = min(offset, size) + cut
        return respond({"data": text, "offset": new_offset, "done": done and new_offset >= size})

    async def reset(self, request: web.Request) -> web.Response:
        paths = reset_wipe(await request.read())
        async with self._lock:
            running = self.current
            if running is not None:
                await self.kill(running)
                await running.done.wait()
            report = await self.wipe(paths)
        return respond(report)

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[auth_middleware(self.secret), errors_middleware],
            client_max_size=MAX_BODY_BYTES,
        )
        app.router.add_get("/healthz", self.healthz)
        app.router.add_post("/attempts", self.post_attempt)
        app.router.add_get("/attempts/{id}", self.get_attempt)
        app.router.add_delete("/attempts/{id}", self.cancel_attempt)
        app.router.add_delete("/attempts/{id}/result", self.ack_attempt)
        app.router.add_get("/attempts/{id}/logs", self.logs)
        app.router.add_post("/reset", self.reset)
        return app
