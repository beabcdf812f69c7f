"""The pod agent: an aiohttp server speaking docs/architecture.md §1 on a unix socket or TCP.

The routes, the attempt table and the concurrency rule are ``pod_runtime.agent_http``'s; this
module runs attempts as jobs (``Runner``), caps their logs (``log_cap``), resets the pod
(``Resetter``) and reports its cards (``GET /gpu``: ``pod_runtime.gpu.Nvml.report``, read on
request only, so a standby maps NVML only when a broker asks, and never creates a CUDA context).

SIGTERM/SIGINT: stop intake, kill any job's tree, stop the zygote, exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
from typing import Any, BinaryIO

from aiohttp import web

from functions.errors import ErrorClass
from pod_runtime import jobuser, spawner, sysvipc
from pod_runtime.agent_auth import AUTHORIZED
from pod_runtime.agent_http import AgentRoutes, respond
from pod_runtime.cgroups import JobCgroups, JobLimits
from pod_runtime.deps import Dependencies
from pod_runtime.gpu import VISIBLE, Nvml, resolve_uuids
from pod_runtime.log_cap import cap_log, servable_while_running
from pod_runtime.package import BlobCache
from pod_runtime.protocol import AttemptSpec
from pod_runtime.reset import Resetter
from pod_runtime.runner import Attempt, Runner
from pod_runtime.settings import AgentSettings, parse_args
from pod_runtime.zygote import set_child_subreaper

IPC_REMOVAL_TIMEOUT_S = 10.0
"""A removal of SysV objects as the jobs' uid takes an interpreter's start; one this slow is
killed and the reset reports the objects left."""


class Agent(AgentRoutes[Attempt]):
    """Owns the pod's runner, resetter, zygote and the attempts kept until acknowledged."""

    def __init__(self, settings: AgentSettings) -> None:
        super().__init__(settings.secret)
        self.settings = settings
        self.layout = settings.layout
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
            cgroups = JobCgroups.open(self.settings.pod_dir, limits)
        self.resetter.cgroups = cgroups
        self.cgroups_note = (
            cgroups.describe() if cgroups else "no writable cgroup v2: jobs tracked via /proc"
        )

        loop = asyncio.get_running_loop()
        self.reaper = spawner.Reaper(loop)
        self.blobs = BlobCache(
            self.layout.blobs,
            max_bytes=self.settings.limits.max_compressed,
            fetch_socket=self.settings.fetch_socket,
        )
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
        if not request.get(AUTHORIZED, True):  # a probe without the secret: up, nothing more
            return respond({"pod": self.settings.pod_name, "authorized": False})
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

    async def gpu_report(self, request: web.Request) -> web.Response:
        """``GET /gpu``: this pod's cards, their compute processes and which are its jobs'."""
        uuids = self.settings.gpu_uuids
        return respond(await asyncio.to_thread(self.nvml.report, uuids, os.getpid()))

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_get("/gpu", self.gpu_report)
        return app

    def new_attempt(self, spec: AttemptSpec) -> Attempt:
        assert self.runner is not None
        return self.runner.new_attempt(spec)

    async def run(self, attempt: Attempt) -> None:
        assert self.runner is not None
        try:
            await self.runner.run(attempt)
        finally:
            if self.current is attempt:
                self.current = None

    async def kill(self, attempt: Attempt) -> None:
        assert self.runner is not None
        await self.runner.kill(attempt, ErrorClass.CANCELLED)

    def ended_log_size(self, attempt: Attempt, done: bool) -> int | None:
        """Ended: the capped log (capped here if it ended before its job started, a cancel).
        Running: None, the part that stays at its offset (``live_log_size``)."""
        if done and attempt.log_size is None:
            attempt.log_size = cap_log(attempt.log, self.settings.max_log_bytes)
        return attempt.log_size

    def live_log_size(self, log: BinaryIO, size: int) -> int:
        return servable_while_running(log, size, self.settings.max_log_bytes)

    async def wipe(self, paths: list[str]) -> dict[str, Any]:
        assert self.runner is not None
        report = await self.resetter.reset(self.runner.scope(), wipe=paths)
        if report.clean:
            self.runner.job_sessions.clear()
            await self._prefork()
        return report.to_json()


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
    if VISIBLE in settings.gpu_uuids:
        settings = dataclasses.replace(
            settings, gpu_uuids=resolve_uuids(settings.gpu_uuids, Nvml())
        )
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
