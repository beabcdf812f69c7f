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

The routes are the real agent's own (``pod_runtime.agent_http.AgentRoutes``); this module
supplies only how an attempt runs (in-process), is cancelled (its task) and how a reset wipes.

Concurrency: event-loop only; ``_lock`` serialises starting an attempt with a reset, as the
real agent's does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from pod_runtime.agent_http import AgentRoutes, respond
from pod_runtime.protocol import AttemptResult, AttemptSpec
from pod_runtime.reset import empty_dir
from pod_runtime.settings import PodLayout
from pool_manager.backends.base import BackendPod
from pool_manager.backends.fake_run import FakeAttempt, OpenPackage, run_attempt

SHUTDOWN_S = 0.5
"""How long a stopping pod waits for requests in flight (a long poll is cut short)."""


class FakePod(AgentRoutes[FakeAttempt]):
    """A pod's record (what the backend lists: ``record``) and its agent."""

    def __init__(
        self,
        record: BackendPod,
        layout: PodLayout,
        socket: Path,
        open_package: OpenPackage,
    ) -> None:
        super().__init__()
        self.record = record
        self.layout = layout
        self.socket = socket
        self.open_package = open_package
        self.abandoned: list[FakeAttempt] = []
        """Attempts that ended while their thread ran on (a timeout, a cancel)."""
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

    def new_attempt(self, spec: AttemptSpec) -> FakeAttempt:
        directory = self.layout.attempts / spec.attempt_id
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "log").touch()
        return FakeAttempt(spec, directory, AttemptResult(spec.attempt_id, started=time.time()))

    def run(self, attempt: FakeAttempt) -> Coroutine[Any, Any, None]:
        return run_attempt(attempt, self.layout, self.record.name, self.open_package)

    def _settle(self, attempt: FakeAttempt, task: asyncio.Task[None]) -> None:
        """An attempt whose thread runs on past its end (a timeout, a cancel) is kept in
        ``abandoned``: a reset is unclean until the thread stops."""
        if attempt.running_thread():
            self.abandoned.append(attempt)
        super()._settle(attempt, task)

    async def kill(self, attempt: FakeAttempt) -> None:
        if attempt.task is not None and not attempt.task.done():
            attempt.task.cancel()

    async def wipe(self, paths: list[str]) -> dict[str, Any]:
        """Unclean while an abandoned attempt's thread still runs; else empty the pod's
        directories. ``paths`` name no volumes here (the fake has none)."""
        start = time.monotonic()
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
        return {"clean": not reason, "reason": reason, "duration_ms": duration_ms}
