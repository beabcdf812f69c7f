"""Starting job processes: forked from the zygote, or a fresh interpreter (exec mode).

The agent is a child subreaper and the only reaper of its children: ``Reaper`` handles
SIGCHLD, ``waitpid(-1)`` reaps everything (so orphaned job processes never linger as zombies)
and resolves the futures of the pids someone ``expect``-ed. No asyncio subprocess is used
anywhere in the agent, so no child watcher competes for exit statuses.

Zygote jobs are children of the zygote; their exit status arrives as a zygote event and
resolves the same futures. If the zygote dies, its jobs reparent to the agent and the agent's
own ``waitpid`` resolves them. A zygote that stops answering (a job can ``SIGSTOP`` its
parent) is treated as dead: the spawn that finds it stopped, or waits past
``ZYGOTE_ANSWER_TIMEOUT_S`` for its answer, kills it (``close``), so its children's exits
reach the agent, and the next spawn starts a new one. Event-loop only; one spawn at a time
(the agent runs one attempt at a time).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from pod_runtime import proctree

ZYGOTE_START_TIMEOUT_S = 120.0
ZYGOTE_ANSWER_TIMEOUT_S = 10.0
"""A zygote answers a spawn within milliseconds (one fork); one silent this long is broken."""
STOPPED_STATES = frozenset({"T", "t"})
"""/proc states of a stopped (SIGSTOP) or traced process: it answers nothing until resumed."""


class Reaper:
    """Reaps every child of the agent; ``wait(pid)`` returns that pid's exit code.

    An exit may be reported before anyone waits for it (a no-op job forked from the zygote
    exits in microseconds), so a resolved future stays in ``_futures`` until ``wait`` takes
    it; exits nobody registered for are kept in a bounded ``_early`` map for the same reason.
    """

    EARLY_LIMIT = 4096

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._futures: dict[int, asyncio.Future[int]] = {}
        self._early: dict[int, int] = {}
        loop.add_signal_handler(signal.SIGCHLD, self.reap)

    def expect(self, pid: int) -> asyncio.Future[int]:
        """Register interest in ``pid`` (call right after creating it, before awaiting)."""
        future = self._futures.get(pid)
        if future is None:
            future = self._futures[pid] = self._loop.create_future()
            code = self._early.pop(pid, None)
            if code is not None:
                future.set_result(code)
        return future

    def born(self, pid: int) -> asyncio.Future[int]:
        """``expect`` for a process just created: anything remembered under its pid belongs
        to an earlier process that had the same number (pids are reused, quickly so in a
        sandbox's own PID namespace) and is dropped first."""
        self._early.pop(pid, None)
        stale = self._futures.get(pid)
        if stale is not None and stale.done():
            del self._futures[pid]
        return self.expect(pid)

    def resolve(self, pid: int, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        future = self._futures.get(pid)
        if future is None:
            if len(self._early) >= self.EARLY_LIMIT:
                self._early.pop(next(iter(self._early)))
            self._early[pid] = code
        elif not future.done():
            future.set_result(code)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.resolve(pid, status)

    async def wait(self, pid: int) -> int:
        future = self.expect(pid)
        try:
            return await asyncio.shield(future)
        finally:
            self.forget(pid)

    def forget(self, pid: int) -> None:
        """Drop ``pid``'s resolved future once its exit code has been consumed."""
        future = self._futures.get(pid)
        if future is not None and future.done():
            del self._futures[pid]

    def close(self) -> None:
        self._loop.remove_signal_handler(signal.SIGCHLD)


def spawn_process(argv: Sequence[str], env: dict[str, str], *, log: Path, reaper: Reaper) -> int:
    """posix_spawn ``argv`` in a new session, stdout+stderr appended to ``log``."""
    pid = os.posix_spawn(
        argv[0],
        list(argv),
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(log), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )
    reaper.born(pid)
    return pid


def exec_job(cfg: dict[str, Any], cfg_path: Path, python: str, reaper: Reaper) -> int:
    """Start a fresh interpreter running ``pod_runtime.job_main`` (zygote disabled).

    A job that drops to another uid (``cfg["job_uid"]``) starts under the agent's own
    environment, and ``job_main`` applies the job's after the drop, as a forked job does:
    the interpreter starts as root, and the job's variables would act on that start
    (``PYTHONWARNINGS`` importing a module that runs ``$BROWSER``: the job's command would
    run as root with the agent's capabilities)."""
    cfg_path.write_bytes(orjson.dumps(cfg))
    argv = [python, "-P", "-m", "pod_runtime.job_main", str(cfg_path)]
    env = cfg["env"]
    if cfg.get("job_uid") is not None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIREPOOL_AGENT_")}
    return spawn_process(argv, env, log=Path(cfg["log"]), reaper=reaper)


class ZygoteClient:
    """The agent's handle on its zygote process; restarts it lazily when it died."""

    def __init__(self, *, python: str, preload: Sequence[str], reaper: Reaper) -> None:
        self.python = python
        self.preload = tuple(preload)
        self.reaper = reaper
        self.pid: int | None = None
        self.spare_pid: int | None = None
        self.info: dict[str, Any] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._events: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._pump: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        ours, theirs = socket.socketpair()
        argv = [self.python, "-P", "-m", "pod_runtime.zygote", "--preload", ",".join(self.preload)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FIREPOOL_AGENT_")}
        try:
            self.pid = os.posix_spawn(
                argv[0],
                argv,
                env,
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), 0),
                    (os.POSIX_SPAWN_DUP2, theirs.fileno(), 1),
                ],
            )
        finally:
            theirs.close()
        exited = self.reaper.born(self.pid)
        exited.add_done_callback(lambda _: self._on_exit())
        self._reader, self._writer = await asyncio.open_unix_connection(sock=ours)
        line = await asyncio.wait_for(self._reader.readline(), ZYGOTE_START_TIMEOUT_S)
        if not line:
            raise RuntimeError("zygote exited during start (see agent.log)")
        self.info = orjson.loads(line)
        if self.info.get("cuda"):
            print(
                f"agent: WARNING zygote mapped {self.info['cuda']} after preload; "
                "forked jobs may not be able to use CUDA",
                file=sys.stderr,
                flush=True,
            )
        self._pump = asyncio.create_task(self._read_events())

    def _on_exit(self) -> None:
        self.pid = None

    def stopped(self) -> bool:
        """The zygote is alive but stopped or traced: it will not answer."""
        proc = proctree.read_proc(self.pid) if self.pid is not None else None
        return proc is not None and proc.state in STOPPED_STATES

    async def _read_events(self) -> None:
        assert self._reader is not None
        while line := await self._reader.readline():
            event = orjson.loads(line)
            if event.get("event") == "exit":
                self.reaper.resolve(int(event["pid"]), int(event["status"]))
            elif event.get("event") == "preforked":
                self.spare_pid = int(event["pid"])
                continue
            else:
                if event.get("event") == "spawned":
                    # Before the next line is read: the exit event may follow right behind.
                    self.reaper.born(int(event["pid"]))
                    if self.spare_pid == int(event["pid"]):
                        self.spare_pid = None
                await self._events.put(event)
        await self._events.put({"event": "gone"})

    def helpers(self) -> set[int]:
        """The zygote and its spare: never job processes, never killed by a reset."""
        return {p for p in (self.pid, self.spare_pid) if p is not None}

    async def prefork(self, cgroup_procs: str | None) -> None:
        """Ask for a spare child while idle (after a clean reset), placed in the next job's
        cgroup when there is one; does not wait for it."""
        async with self._lock:
            if self.pid is None or self._writer is None or self._writer.is_closing():
                return
            self._writer.write(orjson.dumps({"op": "prefork", "cgroup_procs": cgroup_procs}))
            self._writer.write(b"\n")
            await self._writer.drain()

    async def spawn(self, cfg: dict[str, Any]) -> int:
        """Fork a job from the zygote; return its pid (already ``expect``-ed).

        Shielded: once the request is written the zygote forks, so the exchange must finish
        (else its ``spawned`` answer would be read by the next spawn as its own)."""
        return await asyncio.shield(self._spawn(cfg))

    async def _spawn(self, cfg: dict[str, Any]) -> int:
        async with self._lock:
            if (
                self.pid is None
                or self._writer is None
                or self._writer.is_closing()
                or self.stopped()
            ):
                await self.close()
                await self.start()
            assert self._writer is not None
            try:
                async with asyncio.timeout(ZYGOTE_ANSWER_TIMEOUT_S):
                    self._writer.write(orjson.dumps({"op": "spawn", "cfg": cfg}) + b"\n")
                    await self._writer.drain()
                    event = await self._events.get()
            except TimeoutError:
                # Killed: a job it forked meanwhile reparents to the agent, and the reset
                # that follows this failed attempt kills it.
                await self.close()
                raise RuntimeError(
                    f"zygote did not answer a spawn in {ZYGOTE_ANSWER_TIMEOUT_S:.0f} s; "
                    "killed (a new one starts for the next job)"
                ) from None
            if event.get("event") != "spawned":
                raise RuntimeError("zygote died while forking a job")
            return int(event["pid"])

    async def close(self) -> None:
        if self._pump is not None:
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._pump
            self._pump = None
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()
            self._writer = None
        for pid in self.helpers():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.pid = self.spare_pid = None
        self._events = asyncio.Queue()
