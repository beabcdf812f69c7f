"""The pod agent: an aiohttp server speaking docs/architecture.md §1 on a unix socket or TCP.

Concurrency: single event loop. At most one attempt runs at a time (a second POST /attempts
answers 409); ``_lock`` serialises starting an attempt with a reset, so a reset never races a
start. Results (and their logs) are kept until the broker acknowledges them with
``DELETE /attempts/{id}/result``. A re-POST of a known attempt id returns that attempt instead
of running it twice (the broker may retry a POST whose answer it lost).

SIGTERM/SIGINT: stop intake, kill any job's tree, stop the zygote, exit.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import os
import shutil
import signal
import sys
import time
from functools import partial
from typing import Any

import orjson
from aiohttp import web

from functions.errors import Conflict, ErrorClass, FirepoolError, InvalidRequest, NotFound
from pod_runtime import jobuser, spawner, sysvipc
from pod_runtime.cgroups import JobCgroups, JobLimits
from pod_runtime.deps import Dependencies
from pod_runtime.gpu import Nvml
from pod_runtime.log_cap import cap_log, servable_while_running
from pod_runtime.package import BlobCache
from pod_runtime.protocol import AttemptSpec, AttemptState, decode_spec, json_safe
from pod_runtime.reset import Resetter
from pod_runtime.runner import Attempt, Runner
from pod_runtime.settings import AgentSettings, parse_args
from pod_runtime.zygote import set_child_subreaper

LOG_CHUNK = 1 << 20
IPC_REMOVAL_TIMEOUT_S = 10.0
"""A removal of SysV objects as the jobs' uid takes an interpreter's start; one this slow is
killed and the reset reports the objects left."""
MAX_WAIT_S = 600.0
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


class Agent:
    """Owns the pod's runner, resetter, zygote and the attempts kept until acknowledged."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.attempts: dict[str, Attempt] = {}
        self.current: Attempt | None = None
        self._lock = asyncio.Lock()
        self.nvml = Nvml()
        self.resetter = Resetter(
            self.layout,
            sandboxed=settings.sandboxed,
            deadline_s=settings.reset_deadline_s,
            gpu_check=self._gpu_check if settings.gpu_uuids else None,
            fault_unclean_resets=settings.fault_unclean_resets,
            remove_job_ipc=self._remove_job_ipc if settings.job_uid is not None else None,
        )
        self.reaper: spawner.Reaper | None = None
        self.zygote: spawner.ZygoteClient | None = None
        self.runner: Runner | None = None
        self.blobs: BlobCache | None = None
        self.cgroups_note = ""
        self.cgroups: JobCgroups | None = None

    async def _gpu_check(self) -> str | None:
        return await self.nvml.check_after_reset(self.settings.gpu_uuids)

    async def start(self) -> None:
        self.layout.create()
        set_child_subreaper()
        cgroups = None
        if self.settings.cgroups:
            limits = JobLimits(self.settings.job_memory_max, self.settings.job_pids_max)
            cgroups = JobCgroups.open(self.settings.pod_name, limits)
        self.resetter.cgroups = cgroups
        self.cgroups_note = (
            cgroups.describe() if cgroups else "no writable cgroup v2: jobs tracked via /proc"
        )

        loop = asyncio.get_running_loop()
        self.reaper = spawner.Reaper(loop)
        self.blobs = BlobCache(self.layout.blobs, max_bytes=self.settings.limits.max_compressed)
        deps = Dependencies(
            self.layout.site,
            self.layout.root / "cache",
            python=self.settings.python,
            blobs=self.blobs,
            reaper=self.reaper,
            job_uid=self.settings.job_uid,
        )
        if self.settings.zygote:
            self.zygote = spawner.ZygoteClient(
                python=self.settings.python, preload=self.settings.preload, reaper=self.reaper
            )
            await self.zygote.start()
        self.cgroups = cgroups
        self.runner = Runner(
            self.settings,
            reaper=self.reaper,
            zygote=self.zygote,
            blobs=self.blobs,
            deps=deps,
            nvml=self.nvml,
            cgroups=cgroups,
        )
        await self._prefork()
        if self.settings.role == "active" and self.settings.gpu_uuids:
            await asyncio.to_thread(lambda: self.nvml.available)

    async def _prefork(self) -> None:
        """While idle: the next job's cgroup and a spare child already inside it."""
        if self.zygote is not None:
            cgroup = self.cgroups.prepare() if self.cgroups is not None else None
            await self.zygote.prefork(cgroup)

    async def stop(self) -> None:
        running = self.current
        if running is not None and self.runner is not None:
            await self.runner.kill(running, ErrorClass.CANCELLED)
        if self.runner is not None:
            await self.resetter.reset(self.runner.scope())
        if self.zygote is not None:
            await self.zygote.close()
        if self.blobs is not None:
            await self.blobs.close()

    def _get(self, request: web.Request) -> Attempt:
        attempt = self.attempts.get(request.match_info["id"])
        if attempt is None:
            raise NotFound(f"unknown attempt {request.match_info['id']}")
        return attempt

    async def _remove_job_ipc(self) -> None:
        """Remove, as the jobs' uid, the SysV IPC objects they left (the agent may not)."""
        if self.reaper is None or not any(sysvipc.listing().values()):
            return
        argv = [self.settings.python, "-P", "-m", "pod_runtime.sysvipc"]
        argv += ["--as-uid", str(self.settings.job_uid)]
        log = self.layout.root / "agent.log"
        pid = spawner.spawn_process(argv, dict(os.environ), log=log, reaper=self.reaper)
        try:
            await asyncio.wait_for(self.reaper.wait(pid), IPC_REMOVAL_TIMEOUT_S)
        except TimeoutError:  # the wipe then reports what is left: the pod is deleted
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    async def healthz(self, request: web.Request) -> web.Response:
        return respond(
            {
                "pod": self.settings.pod_name,
                "role": self.settings.role,
                "busy": self.current is not None,
                "attempts": list(self.attempts),
                "sandboxed": self.settings.sandboxed,
                "job_uid": self.settings.job_uid,
                "network": self.settings.network,
                "zygote": self.zygote is not None and self.zygote.pid is not None,
                "cgroups": self.cgroups_note,
                "preloaded": self.zygote.info.get("preloaded", []) if self.zygote else [],
            }
        )

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
        return respond(attempt.result.to_json())

    async def start_attempt(self, spec: AttemptSpec) -> Attempt:
        """The attempt ``spec`` names, started now unless it already exists (a retried POST
        is idempotent). Raises ``Conflict`` if another attempt is running."""
        assert self.runner is not None
        async with self._lock:
            attempt = self.attempts.get(spec.attempt_id)
            if attempt is None:
                if self.current is not None:
                    raise Conflict(f"pod is busy with {self.current.spec.attempt_id}")
                attempt = self.runner.new_attempt(spec)
                self.attempts[spec.attempt_id] = attempt
                self.current = attempt
                attempt.task = asyncio.create_task(self._run(attempt))
                attempt.task.add_done_callback(partial(self._settle, attempt))
        return attempt

    async def _run(self, attempt: Attempt) -> None:
        assert self.runner is not None
        try:
            await self.runner.run(attempt)
        finally:
            if self.current is attempt:
                self.current = None

    def _settle(self, attempt: Attempt, task: asyncio.Task[None]) -> None:
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
        return respond(attempt.result.to_json())

    async def cancel_attempt(self, request: web.Request) -> web.Response:
        attempt = self._get(request)
        assert self.runner is not None
        await self.runner.kill(attempt, ErrorClass.CANCELLED)
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
        done = attempt.done.is_set()
        cap = self.settings.max_log_bytes
        if done and attempt.log_size is None:  # ended before its job started (a cancel)
            attempt.log_size = cap_log(attempt.log, cap)
        try:
            with attempt.log.open("rb") as log:
                # Ended: the capped log. Running: only what stays at its offset (log_cap).
                size = attempt.log_size
                if size is None:
                    size = servable_while_running(log, os.fstat(log.fileno()).st_size, cap)
                start = min(offset, size)
                log.seek(start)
                data = log.read(min(LOG_CHUNK, size - start))
        except FileNotFoundError:
            size, data = 0, b""
        if encoding == "base64":  # the log's own bytes, whatever the job wrote
            cut, text = len(data), base64.b64encode(data).decode("ascii")
        else:
            cut = _utf8_boundary(data) if len(data) == LOG_CHUNK else len(data)
            text = data[:cut].decode("utf-8", "replace")
        new_offset = min(offset, size) + cut
        return respond({"data": text, "offset": new_offset, "done": done and new_offset >= size})

    async def reset(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = orjson.loads(raw) if raw.strip() else {}
        if not isinstance(body, dict) or set(body) - {"wipe"}:
            raise InvalidRequest("reset body is {wipe: [paths]}", field="wipe")
        wipe = body.get("wipe") or []
        if not isinstance(wipe, list) or not all(isinstance(p, str) for p in wipe):
            raise InvalidRequest("wipe must be a list of paths", field="wipe")
        assert self.runner is not None
        async with self._lock:
            running = self.current
            if running is not None:
                await self.runner.kill(running, ErrorClass.CANCELLED)
                await running.done.wait()
            report = await self.resetter.reset(self.runner.scope(), wipe=wipe)
            if report.clean:
                self.runner.job_sessions.clear()
                await self._prefork()
        return respond(report.to_json())

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


def _utf8_boundary(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 sequence."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 != 0x80:
            needed = 2 if byte >= 0xC0 else 1
            needed = 3 if byte >= 0xE0 else needed
            needed = 4 if byte >= 0xF0 else needed
            return len(data) if needed <= back else len(data) - back
    return len(data)


async def serve(settings: AgentSettings) -> None:
    agent = Agent(settings)
    await agent.start()
    runner = web.AppRunner(agent.app(), access_log=None, handle_signals=False)
    await runner.setup()
    if settings.listen.startswith("unix:"):
        path = settings.listen[len("unix:") :]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        site: web.BaseSite = web.UnixSite(runner, path)
    else:
        host, _, port = settings.listen[len("tcp:") :].rpartition(":")
        site = web.TCPSite(runner, host or "127.0.0.1", int(port))
    await site.start()
    print(
        f"agent: pod {settings.pod_name} listening on {settings.listen} "
        f"(zygote={settings.zygote}, sandboxed={settings.sandboxed}, job_uid={settings.job_uid}, "
        f"network={settings.network}, role={settings.role})",
        file=sys.stderr,
        flush=True,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await agent.stop()


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    if settings.job_uid is not None:
        paths = [settings.python, *sys.path]
        blocked = jobuser.usable_by(settings.job_uid, settings.pod_dir, paths)
        if blocked is not None:
            print(
                f"agent: WARNING jobs run as the agent's uid, not {settings.job_uid}: as "
                f"that uid a job cannot reach {blocked}",
                file=sys.stderr,
                flush=True,
            )
            settings = dataclasses.replace(settings, job_uid=None)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
