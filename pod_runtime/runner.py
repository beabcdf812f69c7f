"""One attempt, start to finish: bind the package, ensure deps, start the process, collect.

States: ``running`` → ``succeeded`` | ``failed`` | ``cancelled``; the result is final once
``done`` is set and is kept by the agent until acknowledged. Timeout and cancel kill the job's
whole tree (``proctree``) and the cause decides the error class. The agent enforces both
itself: the wait for the job's exit is bounded by its deadline and ends on a cancel, and a
killed job's exit must then be reported within ``EXIT_GRACE_S``, else its reporter (the
zygote, which a job can stop) is killed as broken, which hands the exit to the agent's own
reaper. ``exit_code`` is set only when a job process exited (negative: killed by that
signal). Output is capped (``job_main.MAX_OUTPUT_BYTES``), and so is the log
(``AgentSettings.max_log_bytes``: ``log_cap.cap_log`` once the attempt ended, which sets
``Attempt.log_size``). Event-loop only; the agent runs
at most one attempt at a time, so a ``Runner`` never has two attempts in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from functions.errors import ErrorClass, FirepoolError
from pod_runtime import archive, job_main, jobuser, proctree, spawner
from pod_runtime.agent_http import AgentAttempt
from pod_runtime.cgroups import JobCgroups
from pod_runtime.deps import INSTALL_TIMEOUT_S, Dependencies, DependencyInstallFailed
from pod_runtime.gpu import Nvml
from pod_runtime.jobenv import GpuEnv, build_job_env
from pod_runtime.log_cap import cap_log
from pod_runtime.package import BlobCache
from pod_runtime.protocol import AttemptResult, AttemptSpec, AttemptState
from pod_runtime.reset import INLINE_ENTRIES, empty_dir, entries_within
from pod_runtime.settings import AgentSettings

T = TypeVar("T")
EXIT_GRACE_S = 2.0
"""After a kill verified by /proc, how long the job's exit may take to be reported (a
zygote reports it in milliseconds) before the reporter is deemed broken."""
TOO_DEEP = f"the job's output nests more than {job_main.MAX_NESTING} levels deep"
"""Also checked here: a job can write its result file itself, past ``job_main``'s checks."""
INLINE_PACKAGE_BYTES = 16 * 1024
"""A package zip this small is extracted on the event loop: it holds at most a few hundred
entries and, by the archive's ratio cap, declares at most 3.2 MB, and the usual handful of
source files takes well under a millisecond, less than a worker thread's hand-off and back.
A larger one is extracted in a worker thread."""
RESULT_SLACK_BYTES = 64 * 1024
"""What the result file may hold beyond the output cap (its envelope, or an error's
message and traceback); a larger file was not written by ``job_main``."""


@dataclass(slots=True)
class Attempt(AgentAttempt):
    """An attempt and its files; ``cause`` is set by timeout/cancel before the kill."""

    pid: int | None = None
    spawning: bool = False
    cause: ErrorClass | None = None
    killed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once a timeout's or cancel's kill has run: the job's tree is dead (or reported)."""
    log_size: int | None = None
    """How much of the log is served, once the attempt ended and its log is capped
    (``log_cap.cap_log``); None before."""

    @property
    def out(self) -> Path:
        """What the job writes (its result, output and start mark): the job's own directory
        inside the agent's attempt directory, so it can replace none of the agent's files."""
        return self.dir / "out"


class Runner:
    """Runs attempts for one pod (see module docstring for the state rules)."""

    def __init__(
        self,
        settings: AgentSettings,
        *,
        reaper: spawner.Reaper,
        zygote: spawner.ZygoteClient | None,
        blobs: BlobCache,
        deps: Dependencies,
        nvml: Nvml,
        cgroups: JobCgroups | None = None,
    ) -> None:
        self.settings = settings
        self.layout = settings.layout
        self.reaper = reaper
        self.zygote = zygote
        self.blobs = blobs
        self.deps = deps
        self.nvml = nvml
        self.cgroups = cgroups
        self.job_sessions: set[int] = set()

    def new_attempt(self, spec: AttemptSpec) -> Attempt:
        directory = self.layout.attempts / spec.attempt_id
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "log").touch()
        attempt = Attempt(spec, directory, AttemptResult(spec.attempt_id, started=time.time()))
        attempt.out.mkdir(exist_ok=True)
        return attempt

    def scope(self) -> proctree.JobScope:
        exclude = self.zygote.helpers() if self.zygote is not None else set()
        cgroup_pids = self.cgroups.pids if self.cgroups is not None else None
        return proctree.JobScope(os.getpid(), exclude, set(self.job_sessions), cgroup_pids)

    async def run(self, attempt: Attempt) -> None:
        """Run to a final result; never raises (failures are recorded in the result)."""
        result = attempt.result
        try:
            code = await self._execute(attempt)
            self._collect(attempt, code)
        except asyncio.CancelledError:
            result.state = AttemptState.CANCELLED
            result.fail(ErrorClass.CANCELLED, "cancelled before the job started")
        except FirepoolError as exc:
            result.state = AttemptState.FAILED
            result.fail(exc.error_class, exc.message)
        except Exception as exc:
            result.state = AttemptState.FAILED
            result.fail(ErrorClass.INTERNAL, f"agent error: {exc!r}")
        finally:
            result.finished = time.time()
            attempt.log_size = cap_log(attempt.log, self.settings.max_log_bytes)
            attempt.done.set()

    async def _bind(self, attempt: Attempt) -> list[str]:
        spec = attempt.spec
        if any(os.scandir(self.layout.pkg)):  # normally emptied by the last reset
            await finish_in_thread(empty_dir, self.layout.pkg)
        if spec.package is not None:
            zip_path, _ = await self.blobs.get(spec.package, deadline_s=spec.timeout_s)
            if zip_path.stat().st_size <= INLINE_PACKAGE_BYTES:
                archive.extract(zip_path, self.layout.pkg, self.settings.limits)
            else:
                await finish_in_thread(
                    archive.extract, zip_path, self.layout.pkg, self.settings.limits
                )
        if spec.requirements is not None:
            install = self.deps.ensure(spec.requirements, attempt.log)
            try:
                return [str(await asyncio.wait_for(install, INSTALL_TIMEOUT_S))]
            except TimeoutError as exc:
                raise DependencyInstallFailed(
                    f"installing requirements took longer than {INSTALL_TIMEOUT_S:.0f} s"
                ) from exc
        return []

    def _gpu_env(self, attempt: Attempt) -> GpuEnv:
        uuids = self.settings.gpu_uuids
        if not uuids:
            return GpuEnv()
        cache = self.layout.gpu_accounting / f"{attempt.spec.attempt_id}.cache"
        return GpuEnv(uuids, self.nvml.memory_mib(uuids), str(cache))

    async def _execute(self, attempt: Attempt) -> int | None:
        spec = attempt.spec
        sys_path = await self._bind(attempt)
        gpu = GpuEnv()
        if self.settings.gpu_uuids:
            gpu = await asyncio.to_thread(self._gpu_env, attempt)
        files = {
            "input": str(attempt.dir / "input.json"),
            "result": str(attempt.out / "result.json"),
            "first_instruction": str(attempt.out / "first_instruction"),
        }
        agent_env = {
            "FIREPOOL_ATTEMPT_ID": spec.attempt_id,
            "FIREPOOL_POD": self.settings.pod_name,
            "FIREPOOL_INPUT_FILE": files["input"],
            "FIREPOOL_OUTPUT_FILE": str(attempt.out / "output.json"),
            "FIREPOOL_SCRATCH_DIR": str(self.layout.scratch),
            "TMPDIR": str(self.layout.scratch),
        }
        job_uid = self.settings.job_uid
        if job_uid is not None:  # the agent's $HOME is an empty root-owned tmpfs
            agent_env["HOME"] = str(self.layout.scratch)
            writable = (self.layout.scratch, self.layout.gpu_accounting, attempt.out)
            jobuser.hand_over(writable, job_uid)
            # The package's files too: a job may update what it shipped (a SQLite file, a
            # config); extracted as root, they would be read-only to it.
            if entries_within([self.layout.pkg], INLINE_ENTRIES):
                jobuser.hand_over_tree(self.layout.pkg, job_uid)
            else:
                await finish_in_thread(jobuser.hand_over_tree, self.layout.pkg, job_uid)
        env, dropped = build_job_env(
            pod_env=os.environ,
            user_env=spec.env,
            system_env=spec.system_env,
            agent_env=agent_env,
            gpu=gpu,
        )
        if dropped:
            with attempt.log.open("a") as log:
                log.write(f"[firepool] dropped environment variables: {', '.join(dropped)}\n")
        Path(files["input"]).write_bytes(orjson.dumps(spec.input))
        cfg: dict[str, Any] = {
            **files,
            "entrypoint": spec.entrypoint,
            "command": list(spec.command) if spec.command else None,
            "pkg_dir": str(self.layout.pkg),
            "sys_path": sys_path,
            "env": env,
            "log": str(attempt.log),
            "cgroup_procs": self.cgroups.new_job(spec.attempt_id) if self.cgroups else None,
            "job_uid": job_uid,
        }
        attempt.spawning = True  # from here a cancel kills the process instead of the task
        if self.zygote is not None:
            pid = await self.zygote.spawn(cfg)
        else:
            pid = spawner.exec_job(cfg, attempt.dir / "cfg.json", self.settings.python, self.reaper)
        attempt.pid = pid
        self.job_sessions.add(pid)
        exited = self.reaper.expect(pid)
        if attempt.cause is not None:  # cancelled while the spawn was in flight
            attempt.cause = None
            await self.kill(attempt, ErrorClass.CANCELLED)
        try:
            return await self._wait_exit(attempt, exited)
        finally:
            self.reaper.forget(pid)

    async def _wait_exit(self, attempt: Attempt, exited: asyncio.Future[int]) -> int | None:
        """The job's exit code, waited for no longer than its deadline or a cancel; None if
        a killed job's exit could not be observed at all (it survived SIGKILL)."""
        stop = asyncio.ensure_future(attempt.killed.wait())
        either: set[asyncio.Future[Any]] = {exited, stop}
        try:
            await asyncio.wait(
                either, timeout=attempt.spec.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            stop.cancel()
        if exited.done():
            return exited.result()
        await self.kill(attempt, ErrorClass.TIMEOUT)  # no-op when a cancel came first
        await attempt.killed.wait()
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(exited), EXIT_GRACE_S)
        if self.zygote is None:
            return None
        # The job is dead but its parent, the zygote, does not report it (stopped, say):
        # killed, its children's zombies reparent to the agent, whose reaper reports them.
        print(
            f"agent: zygote did not report the exit of job {attempt.pid} within "
            f"{EXIT_GRACE_S:.0f} s; killing it (a new one starts for the next job)",
            file=sys.stderr,
            flush=True,
        )
        await self.zygote.close()
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(asyncio.shield(exited), EXIT_GRACE_S)
        return None

    async def kill(self, attempt: Attempt, cause: ErrorClass) -> None:
        """Timeout or cancel: record the cause, then kill the job's whole tree."""
        if attempt.done.is_set() or attempt.cause is not None:
            return
        attempt.cause = cause
        if attempt.pid is None:
            if attempt.task is not None and not attempt.spawning:
                attempt.task.cancel()  # still binding: nothing of the job runs yet
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                os.kill(attempt.pid, signal.SIGKILL)
            await proctree.terminate(
                self.scope(),
                extra_kill=self.cgroups.kill if self.cgroups is not None else None,
                deadline_s=self.settings.reset_deadline_s,
            )
        finally:
            attempt.killed.set()

    def _collect(self, attempt: Attempt, code: int | None) -> None:
        result, spec = attempt.result, attempt.spec
        result.exit_code = code
        with contextlib.suppress(OSError, ValueError, OutputTooLarge):
            result.first_instruction = float(read_capped(attempt.out / "first_instruction", 64))
        if attempt.cause is not None:
            result.state = (
                AttemptState.CANCELLED
                if attempt.cause == ErrorClass.CANCELLED
                else AttemptState.FAILED
            )
            what = "timed out" if attempt.cause == ErrorClass.TIMEOUT else "was cancelled"
            result.fail(attempt.cause, f"the job {what}; its process tree was killed")
            return
        if code is None:  # only a killed job's exit can go unobserved: not reached
            result.state = AttemptState.FAILED
            result.fail(ErrorClass.INTERNAL, "the job's exit was not observed")
            return
        oom = self.cgroups.oom_killed() if self.cgroups is not None else False
        if oom:
            result.state = AttemptState.FAILED
            result.fail(ErrorClass.OOM, "the job exceeded its memory limit and was killed")
            return
        if spec.command:
            self._collect_command(attempt, code)
        else:
            self._collect_entrypoint(attempt, code)

    def _collect_command(self, attempt: Attempt, code: int) -> None:
        result = attempt.result
        if code != 0:
            result.state = AttemptState.FAILED
            result.fail(ErrorClass.NON_ZERO_EXIT, exit_message(code) + _exec_failure(attempt))
            return
        try:
            raw = read_capped(attempt.out / "output.json", job_main.MAX_OUTPUT_BYTES)
        except OutputTooLarge as exc:
            result.state = AttemptState.FAILED
            result.fail(ErrorClass.FUNCTION_ERROR, str(exc))
            return
        except OSError:
            result.state = AttemptState.SUCCEEDED
            return
        try:
            output = orjson.loads(raw)
        except orjson.JSONDecodeError:
            output = raw.decode("utf-8", "replace")
        if job_main.nests_too_deep(output):
            result.state = AttemptState.FAILED
            result.fail(ErrorClass.FUNCTION_ERROR, TOO_DEEP)
            return
        result.state = AttemptState.SUCCEEDED
        result.output = output

    def _collect_entrypoint(self, attempt: Attempt, code: int) -> None:
        result = attempt.result
        limit = job_main.MAX_OUTPUT_BYTES + RESULT_SLACK_BYTES
        try:
            outcome = orjson.loads(read_capped(attempt.out / "result.json", limit))
        except OutputTooLarge as exc:  # not job_main's: the job wrote the file itself
            result.state = AttemptState.FAILED
            result.fail(ErrorClass.FUNCTION_ERROR, str(exc))
            return
        except (OSError, orjson.JSONDecodeError):
            result.state = AttemptState.FAILED
            if code == 0:
                result.fail(ErrorClass.FUNCTION_ERROR, "the process exited without a result")
            elif code == job_main.RUNTIME_FAILED:
                # job_main's own failure, not the function's (its log says which): a full disk
                # writing the result must not read NonZeroExit, the caller's fault.
                # Retried on another pod only if no user code ran (``retry_policy``).
                result.fail(
                    ErrorClass.INTERNAL,
                    f"the job's runtime failed (exit {code}) before recording a result: "
                    "see the job's log",
                )
            else:
                result.fail(ErrorClass.NON_ZERO_EXIT, exit_message(code))
            return
        if not isinstance(outcome, dict):  # not job_main's: the job wrote the file itself
            result.state = AttemptState.FAILED
            result.fail(ErrorClass.FUNCTION_ERROR, "the job's result file is not an object")
            return
        if outcome.get("ok"):
            if job_main.nests_too_deep(outcome.get("output")):
                result.state = AttemptState.FAILED
                result.fail(ErrorClass.FUNCTION_ERROR, TOO_DEEP)
                return
            result.state = AttemptState.SUCCEEDED
            result.output = outcome.get("output")
            return
        result.state = AttemptState.FAILED
        result.fail(
            ErrorClass.FUNCTION_ERROR,
            f"{outcome.get('type')}: {outcome.get('message')}",
            type=str(outcome.get("type")),
            traceback=str(outcome.get("traceback")),
        )


class OutputTooLarge(Exception):
    """A job's output file is larger than the agent will read."""


def read_capped(path: Path, limit: int) -> bytes:
    """The bytes of ``path``, a file the job wrote (never read through a symlink:
    ``jobuser.open_job_file``), unless it holds more than ``limit`` (``OutputTooLarge``,
    naming both: the agent never reads, keeps or sends more than the cap)."""
    with jobuser.open_job_file(path) as src:
        data = src.read(limit + 1)
        size = os.fstat(src.fileno()).st_size
    if len(data) > limit:
        raise OutputTooLarge(f"the job's output is {size} bytes, over the {limit}-byte cap")
    return data


async def finish_in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` in a worker thread; if the caller is cancelled, still wait for the thread
    (a cancelled attempt must not leave a thread writing into the next job's package dir)."""
    future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await asyncio.wait([future])
        raise


def _exec_failure(attempt: Attempt) -> str:
    """``": <why>"`` if ``job_main`` could not start the command (it wrote why before exiting
    127: a script without its execute bit, an argument list over the kernel's limit); else
    ``""``. Without it those read only ``exited with code 127``, the cause in the log."""
    try:
        data = orjson.loads(read_capped(attempt.out / "result.json", 4096))
    except (OSError, OutputTooLarge, orjson.JSONDecodeError):
        return ""
    why = data.get("message") if isinstance(data, dict) else None
    return f": {why[:1000]}" if isinstance(why, str) and why else ""


def exit_message(code: int) -> str:
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"the process was killed by {name}"
    return f"the process exited with code {code}"
