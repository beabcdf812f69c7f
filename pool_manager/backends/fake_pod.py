"""One fake pod: the pod agent protocol (docs/architecture.md §1) served by aiohttp on a unix
socket inside the event loop that created the pod, over attempts run in-process
(``fake_run``). The broker's ``AgentClient`` talks to it exactly as to a real agent.

Served as the real agent serves them: ``GET /healthz``; ``POST /attempts`` (decoded strictly
by ``pod_runtime.protocol.decode_spec``: 400 with the typed error; 409 while another attempt
runs; a known attempt id answers that attempt instead of running it twice; ``wait: true``
answers the result when it ends, else 202); ``GET /attempts/{id}?wait=S`` (long-polls);
``DELETE /attempts/{id}`` (cancel); ``DELETE /attempts/{id}/result`` (acknowledge: forgotten);
``GET /attempts/{id}/logs?offset=N[&encoding=base64]``; ``POST /reset`` (cancels what runs,
empties the package, scratch and GPU-accounting directories; unclean while a timed-out or
cancelled attempt's thread still runs, since nothing can stop it). The ``wipe`` paths a reset
names are checked, not wiped (the fake has no volumes), and logs are not capped.

Concurrency: event-loop only; ``_lock`` serialises starting an attempt with a reset, as the
real agent's does.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import shutil
import time
from pathlib import Path

import orjson
from aiohttp import web

from functions.errors import Conflict, ErrorClass, InvalidRequest, NotFound
from pod_runtime.agent import LOG_CHUNK, MAX_WAIT_S, errors_middleware, respond
from pod_runtime.protocol import AttemptResult, AttemptSpec, AttemptState, decode_spec
from pod_runtime.reset import empty_dir
from pod_runtime.settings import PodLayout
from pool_manager.backends.base import BackendPod
from pool_manager.backends.fake_run import FakeAttempt, OpenPackage, run_attempt

SHUTDOWN_S = 0.5
"""How long a stopping pod waits for requests in flight (a long poll is cut short)."""


class FakePod:
    """A pod's record (what the backend lists: ``record``) and its agent."""

    def __init__(
        self,
        record: BackendPod,
        layout: PodLayout,
        socket: Path,
        open_package: OpenPackage,
    ) -> None:
        self.record = record
        self.layout = layout
        self.socket = socket
        self.open_package = open_package
        self.attempts: dict[str, FakeAttempt] = {}
        self.current: FakeAttempt | None = None
        self.abandoned: list[FakeAttempt] = []
        """Attempts that ended while their thread ran on (a timeout, a cancel)."""
        self._lock = asyncio.Lock()
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        await asyncio.to_thread(self.layout.create)
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=SHUTDOWN_S)
        await runner.setup()
        site = web.UnixSite(runner, str(self.socket))
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner

    async def stop(self) -> None:
        """Stop serving and end every attempt (``cancelled``); the record stays, not alive."""
        self.record.alive = False
        tasks = [a.task for a in self.attempts.values() if a.task is not None and not a.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
        self.socket.unlink(missing_ok=True)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[errors_middleware], client_max_size=64 * 1024 * 1024)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_post("/attempts", self.post_attempt)
        app.router.add_get("/attempts/{id}", self.get_attempt)
        app.router.add_delete("/attempts/{id}", self.cancel_attempt)
        app.router.add_delete("/attempts/{id}/result", self.ack_attempt)
        app.router.add_get("/attempts/{id}/logs", self.logs)
        app.router.add_post("/reset", self.reset)
        return app

    def _get(self, request: web.Request) -> FakeAttempt:
        attempt = self.attempts.get(request.match_info["id"])
        if attempt is None:
            raise NotFound(f"unknown attempt {request.match_info['id']}")
        return attempt

    async def healthz(self, request: web.Request) -> web.Response:
        return respond(
            {
                "pod": self.record.name,
                "role": self.record.role,
                "busy": self.current is not None,
                "attempts": list(self.attempts),
                "fake": True,
            }
        )

    async def post_attempt(self, request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"body is not JSON: {exc}") from exc
        spec = decode_spec(body)
        attempt = await self._start(spec)
        if not spec.wait:
            return respond({"attempt_id": spec.attempt_id}, 202)
        await attempt.done.wait()
        return respond(attempt.result.to_json())

    async def _start(self, spec: AttemptSpec) -> FakeAttempt:
        async with self._lock:
            attempt = self.attempts.get(spec.attempt_id)
            if attempt is not None:  # a retried POST
                return attempt
            if self.current is not None:
                raise Conflict(f"pod is busy with {self.current.spec.attempt_id}")
            directory = self.layout.attempts / spec.attempt_id
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "log").touch()
            result = AttemptResult(spec.attempt_id, started=time.time())
            attempt = FakeAttempt(spec, directory, result)
            self.attempts[spec.attempt_id] = self.current = attempt
            work = run_attempt(attempt, self.layout, self.record.name, self.open_package)
            attempt.task = asyncio.create_task(work)
            attempt.task.add_done_callback(lambda _: self._settle(attempt))
        return attempt

    def _settle(self, attempt: FakeAttempt) -> None:
        """The attempt's task ended (a task cancelled before its first step never runs its
        body: settle it here too, or its waiters would wait forever)."""
        if not attempt.done.is_set():
            attempt.result.state = AttemptState.CANCELLED
            attempt.result.fail(ErrorClass.CANCELLED, "cancelled before the job started")
            attempt.result.finished = time.time()
            attempt.done.set()
        if attempt.running_thread():
            self.abandoned.append(attempt)
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
        return respond(attempt.result.to_json())

    async def cancel_attempt(self, request: web.Request) -> web.Response:
        attempt = self._get(request)
        if attempt.task is not None and not attempt.task.done():
            attempt.task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(attempt.done.wait(), 10.0)
        return respond(attempt.result.to_json())

    async def ack_attempt(self, request: web.Request) -> web.Response:
        attempt = self._get(request)
        if not attempt.done.is_set():
            raise Conflict(f"attempt {attempt.spec.attempt_id} is still running")
        del self.attempts[attempt.spec.attempt_id]
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
        try:
            with attempt.log.open("rb") as log:
                size = log.seek(0, 2)
                start = min(offset, size)
                log.seek(start)
                data = log.read(min(LOG_CHUNK, size - start))
        except FileNotFoundError:
            size, start, data = 0, 0, b""
        if encoding == "base64":
            text = base64.b64encode(data).decode("ascii")
        else:
            text = data.decode("utf-8", "replace")
        end = start + len(data)
        return respond({"data": text, "offset": end, "done": done and end >= size})

    async def reset(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = orjson.loads(raw) if raw.strip() else {}
        except orjson.JSONDecodeError as exc:
            raise InvalidRequest(f"body is not JSON: {exc}") from exc
        if not isinstance(body, dict) or set(body) - {"wipe"}:
            raise InvalidRequest("reset body is {wipe: [paths]}", field="wipe")
        wipe = body.get("wipe") or []
        if not isinstance(wipe, list) or not all(isinstance(p, str) for p in wipe):
            raise InvalidRequest("wipe must be a list of paths", field="wipe")
        start = time.monotonic()
        async with self._lock:
            running = self.current
            if running is not None and running.task is not None:
                running.task.cancel()
                await running.done.wait()
            self.abandoned = [a for a in self.abandoned if a.running_thread()]
            if self.abandoned:
                ids = ", ".join(a.spec.attempt_id for a in self.abandoned)
                reason = f"the thread of attempt {ids} still runs (a fake pod cannot stop it)"
            else:
                problems: list[str] = []
                for path in self.layout.wiped():
                    problems += await asyncio.to_thread(empty_dir, path)
                reason = "; ".join(problems[:5])
        duration_ms = round((time.monotonic() - start) * 1000, 3)
        return respond({"clean": not reason, "reason": reason, "duration_ms": duration_ms})
