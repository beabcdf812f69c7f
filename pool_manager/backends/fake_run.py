"""One attempt on a fake pod, run in the broker's own process (``fake.py`` lists the limits).

- Package: its bytes read by digest through the reader the pod was given, verified (sha256;
  a mismatch or a failed read is ``PackageRejected``), kept in the pod's blob cache, and
  unpacked into the pod's package directory by the pod agent's own safe extractor
  (``pod_runtime.archive``). A requirements file is refused (``DependencyInstallFailed``):
  the fake installs nothing.
- ``mod:fn``: imported under a prefix of its own (``_firepool_fake_<hex>.mod``, a package whose
  path is the package directory), so two packages' ``handler.py`` never share an entry of
  ``sys.modules`` and relative imports inside a package work; the prefix's modules are
  dropped from ``sys.modules`` when the call returns. The call runs in a daemon thread of its
  own (a coroutine function on an event loop of that thread); what that thread prints goes to
  the attempt's log (``_ThreadRouter``). Without a package, ``mod`` is imported by its own
  name (the standard library, what the broker's environment has installed). The outcome is
  judged as ``pod_runtime.job_main`` judges it: an exception is ``FunctionError`` with its
  type and traceback (the traceback also in the log), a return value must be JSON (no NaN,
  at most ``MAX_OUTPUT_BYTES``, not nested past ``MAX_NESTING``).
- ``command``: a subprocess in its own session with the package directory as its working
  directory and the real agent's files and variables (``$FIREPOOL_INPUT_FILE``,
  ``$FIREPOOL_OUTPUT_FILE``, the user's and the broker's env filtered as the agent filters it);
  a timeout or cancel kills its process group.

Concurrency: ``run_attempt`` runs as one task on the pod's event loop; the only state shared
with the attempt's thread is the future it settles (through ``call_soon_threadsafe``) and the
stream routes (``_routes``, under ``_routes_lock``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib
import inspect
import os
import secrets
import signal
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import orjson

from functions.errors import ErrorClass, FirepoolError, PackageRejected
from pod_runtime.agent_http import AgentAttempt
from pod_runtime.archive import DEFAULT_LIMITS, extract
from pod_runtime.deps import DependencyInstallFailed
from pod_runtime.job_main import (
    MAX_NESTING,
    MAX_OUTPUT_BYTES,
    MESSAGE_CHARS,
    TRACEBACK_CHARS,
    TRACEBACK_LINES,
    holds_non_finite,
    nests_too_deep,
)
from pod_runtime.jobenv import GpuEnv, build_job_env
from pod_runtime.protocol import AttemptResult, AttemptState
from pod_runtime.reset import empty_dir
from pod_runtime.runner import exit_message, finish_in_thread
from pod_runtime.settings import PodLayout
from pool_manager.backends.local import pod_environment

OpenPackage = Callable[[str], BinaryIO]
"""A package's stored bytes by digest, as a binary file the caller closes
(``functions.stores.PackageStore.open``)."""
ABANDONED = "its thread runs on (the fake backend cannot stop a thread; the pod's reset fails)"


@dataclass(slots=True)
class FakeAttempt(AgentAttempt):
    """An attempt and its files (``dir``: log, input, output), kept until acknowledged."""

    thread: threading.Thread | None = None
    """An entrypoint's thread: alive while the function runs, a timeout or cancel included."""
    returned: bool = False
    """Set by the thread once the function returned or raised: what the thread does after
    (hand the outcome to the loop, exit) runs no user code."""

    def running_thread(self) -> bool:
        """Whether the function still runs in its thread (a timed-out or cancelled call)."""
        return self.thread is not None and self.thread.is_alive() and not self.returned


async def run_attempt(
    attempt: FakeAttempt, layout: PodLayout, pod: str, open_package: OpenPackage
) -> None:
    """Run ``attempt`` to a final result; never raises. A cancel of the task (the pod's
    ``DELETE /attempts/{id}``, or the pod stopping) ends it ``cancelled``."""
    result = attempt.result
    try:
        await _bind(attempt, layout, open_package)
        if attempt.spec.command is not None:
            await _run_command(attempt, layout, pod)
        else:
            await _run_entrypoint(attempt, layout)
    except asyncio.CancelledError:
        result.state = AttemptState.CANCELLED
        note = f"; {ABANDONED}" if attempt.running_thread() else ""
        result.fail(ErrorClass.CANCELLED, f"the job was cancelled{note}")
    except FirepoolError as exc:
        result.state = AttemptState.FAILED
        result.fail(exc.error_class, exc.message)
    except Exception as exc:
        result.state = AttemptState.FAILED
        result.fail(ErrorClass.INTERNAL, f"fake pod error: {exc!r}")
    finally:
        result.finished = time.time()
        attempt.done.set()


async def _bind(attempt: FakeAttempt, layout: PodLayout, open_package: OpenPackage) -> None:
    spec = attempt.spec
    if spec.requirements is not None:
        raise DependencyInstallFailed(
            "the fake backend installs no requirements: run this function on local pods"
        )
    if any(os.scandir(layout.pkg)):  # normally emptied by the last reset
        await finish_in_thread(empty_dir, layout.pkg)
    if spec.package is None:
        return
    digest = spec.package.digest
    cached = layout.blobs / digest
    if not cached.is_file():
        try:
            data = await asyncio.to_thread(_read, open_package, digest)
        except Exception as exc:
            raise PackageRejected(f"package {digest} could not be read: {exc!r}") from exc
        if hashlib.sha256(data).hexdigest() != digest:
            raise PackageRejected(f"package {digest}: its bytes do not match the digest")
        await asyncio.to_thread(_write_atomically, cached, data)
    await finish_in_thread(extract, cached, layout.pkg, DEFAULT_LIMITS)


def _read(open_package: OpenPackage, digest: str) -> bytes:
    """The package's bytes, at most the agent's cap on a package (``ArchiveLimits``)."""
    with open_package(digest) as src:
        data = src.read(DEFAULT_LIMITS.max_compressed + 1)
    if len(data) > DEFAULT_LIMITS.max_compressed:
        raise ValueError(f"over the {DEFAULT_LIMITS.max_compressed}-byte cap on a package")
    return data


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


# -- entrypoints: a thread per call ----------------------------------------------------------


async def _run_entrypoint(attempt: FakeAttempt, layout: PodLayout) -> None:
    spec, result = attempt.spec, attempt.result
    assert spec.entrypoint is not None
    loop = asyncio.get_running_loop()
    settled: asyncio.Future[tuple[dict[str, Any], float]] = loop.create_future()

    def settle(outcome: tuple[dict[str, Any], float]) -> None:
        if not settled.done():
            settled.set_result(outcome)

    def main() -> None:
        pkg = layout.pkg if spec.package is not None else None
        try:
            outcome = call_entrypoint(pkg, spec.entrypoint or "", spec.input, attempt.log)
        except BaseException as exc:  # the log could not be opened: settle all the same
            outcome = _failure(exc, "the fake pod could not make the call: "), time.time()
        attempt.returned = True
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle, outcome)

    attempt.thread = threading.Thread(target=main, name=f"fake {spec.attempt_id}", daemon=True)
    attempt.thread.start()
    try:
        outcome, first_instruction = await asyncio.wait_for(asyncio.shield(settled), spec.timeout_s)
    except TimeoutError:
        result.state = AttemptState.FAILED
        result.fail(ErrorClass.TIMEOUT, f"the job timed out; {ABANDONED}")
        return
    result.first_instruction = first_instruction
    if outcome.get("ok"):
        result.state, result.output = AttemptState.SUCCEEDED, outcome.get("output")
        return
    result.state = AttemptState.FAILED
    result.fail(
        ErrorClass.FUNCTION_ERROR,
        f"{outcome.get('type')}: {outcome.get('message')}",
        type=str(outcome.get("type")),
        traceback=str(outcome.get("traceback")),
    )


def call_entrypoint(
    pkg_dir: Path | None, entrypoint: str, payload: Any, log: Path
) -> tuple[dict[str, Any], float]:
    """Import ``mod:fn`` (from ``pkg_dir`` under a prefix of its own; without a package, by
    its own name from this process's ``sys.path``, as a real pod imports it from its image)
    and call ``fn(payload)`` in this thread, its prints going to ``log``; returns
    ``pod_runtime.job_main``'s outcome dict and the wall time just before the import. Never
    raises."""
    module_name, _, attr = entrypoint.partition(":")
    prefix = f"_firepool_fake_{secrets.token_hex(8)}"
    if pkg_dir is not None:
        parent = types.ModuleType(prefix)
        parent.__path__ = [str(pkg_dir)]
        module_name = f"{prefix}.{module_name}"
    stream = open(log, "a", encoding="utf-8", errors="backslashreplace", buffering=1)  # noqa: SIM115
    with stream, _routed_to(stream):
        first_instruction = time.time()
        if pkg_dir is not None:
            sys.modules[prefix] = parent
        try:
            fn = getattr(importlib.import_module(module_name), attr)
            output = fn(payload)
            if inspect.isawaitable(output):
                output = asyncio.run(_awaited(output))
        except BaseException as exc:  # the function's failure, whatever it is
            traceback.print_exception(exc)
            return _failure(exc), first_instruction
        finally:
            # ``list`` copies the keys in one step under the GIL: other calls' threads import
            # meanwhile, and iterating the live dict would fail when it changes size.
            names = list(sys.modules)
            for name in [m for m in names if m == prefix or m.startswith(prefix + ".")]:
                sys.modules.pop(name, None)
    return _checked_output(output), first_instruction


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _checked_output(output: Any) -> dict[str, Any]:
    """``{"ok": True, "output": ...}`` for a value JSON can carry within the caps, as the real
    pod's ``job_main`` checks it; else its failure."""
    try:
        data = orjson.dumps(output, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        return _failure(exc, "return value is not JSON-serializable: ")
    if b"null" in data and holds_non_finite(output):
        not_json = ValueError("return value holds NaN or Infinity, which JSON has no form for")
        return _failure(not_json, "return value is not JSON-serializable: ")
    if len(data) > MAX_OUTPUT_BYTES:
        too_big = f"return value is {len(data)} bytes as JSON, over the {MAX_OUTPUT_BYTES}-byte cap"
        return _failure(ValueError(too_big))
    if nests_too_deep(output):
        return _failure(ValueError(f"return value nests more than {MAX_NESTING} levels deep"))
    return {"ok": True, "output": orjson.loads(data)}


def _failure(exc: BaseException, prefix: str = "") -> dict[str, Any]:
    """The outcome of a failed call, shaped and capped as ``job_main`` shapes it."""
    lines = "".join(traceback.format_exception(exc)).splitlines()
    try:
        text = str(exc)
    except Exception:
        text = f"<{type(exc).__name__} whose message could not be printed>"
    message = (prefix + text)[:MESSAGE_CHARS]
    tail = "\n".join(lines[-TRACEBACK_LINES:])[-TRACEBACK_CHARS:]
    return {"ok": False, "type": type(exc).__name__, "message": message, "traceback": tail}


class _ThreadRouter:
    """Stands in for ``sys.stdout`` or ``sys.stderr`` while fake attempts run: what an
    attempt's own thread writes goes to its log, every other thread's to the stream this
    replaced. Threads the function starts write to that stream too (not routed)."""

    def __init__(self, fallback: TextIO) -> None:
        self.fallback = fallback

    def _target(self) -> TextIO:
        return _routes.get(threading.get_ident(), self.fallback)

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:  # buffer, fileno, encoding, isatty...
        return getattr(self._target(), name)


_routes: dict[int, TextIO] = {}
"""The log stream of each thread running an attempt (installed while any runs)."""
_routes_lock = threading.Lock()


@contextlib.contextmanager
def _routed_to(stream: TextIO) -> Iterator[None]:
    """Route this thread's ``sys.stdout``/``sys.stderr`` to ``stream`` meanwhile. A router is
    installed by any call that finds none in place (another stream may have replaced it while
    an earlier call's thread still ran, as pytest's capture does between tests) and removed
    after the last call."""
    ident = threading.get_ident()
    with _routes_lock:
        for name in ("stdout", "stderr"):
            current = getattr(sys, name)
            if not isinstance(current, _ThreadRouter):
                setattr(sys, name, _ThreadRouter(current))
        _routes[ident] = stream
    try:
        yield
    finally:
        with _routes_lock:
            del _routes[ident]
            if not _routes:
                for name in ("stdout", "stderr"):
                    current = getattr(sys, name)
                    if isinstance(current, _ThreadRouter):
                        setattr(sys, name, current.fallback)


# -- commands: a process per call ------------------------------------------------------------


async def _run_command(attempt: FakeAttempt, layout: PodLayout, pod: str) -> None:
    spec, result = attempt.spec, attempt.result
    assert spec.command is not None
    out = attempt.dir / "out"
    out.mkdir(exist_ok=True)
    input_file, output_file = attempt.dir / "input.json", out / "output.json"
    input_file.write_bytes(orjson.dumps(spec.input))
    env, dropped = build_job_env(
        pod_env=pod_environment(os.environ),
        user_env=spec.env,
        system_env=spec.system_env,
        agent_env={
            "FIREPOOL_ATTEMPT_ID": spec.attempt_id,
            "FIREPOOL_POD": pod,
            "FIREPOOL_INPUT_FILE": str(input_file),
            "FIREPOOL_OUTPUT_FILE": str(output_file),
            "FIREPOOL_SCRATCH_DIR": str(layout.scratch),
            "TMPDIR": str(layout.scratch),
        },
        gpu=GpuEnv(),
    )
    with attempt.log.open("ab") as log:
        if dropped:
            log.write(f"[firepool] dropped environment variables: {', '.join(dropped)}\n".encode())
        result.first_instruction = time.time()
        try:
            process = await asyncio.create_subprocess_exec(
                *spec.command,
                cwd=layout.pkg,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:  # what job_main's exec failure reports
            result.state, result.exit_code = AttemptState.FAILED, 127
            why = f"cannot run {spec.command[0]!r}: {exc.strerror or exc}"
            result.fail(ErrorClass.NON_ZERO_EXIT, f"{exit_message(127)}: {why}")
            return
    try:
        code = await asyncio.wait_for(process.wait(), spec.timeout_s)
    except TimeoutError:
        result.exit_code = await _kill(process)
        result.state = AttemptState.FAILED
        result.fail(ErrorClass.TIMEOUT, "the job timed out; its process group was killed")
        return
    finally:
        if process.returncode is None:  # cancelled: the task's cancel goes on after this
            await asyncio.shield(_kill(process))
    result.exit_code = code
    if code != 0:
        result.state = AttemptState.FAILED
        result.fail(ErrorClass.NON_ZERO_EXIT, exit_message(code))
        return
    _collect_output(result, output_file)


async def _kill(process: asyncio.subprocess.Process) -> int:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return await process.wait()


def _collect_output(result: AttemptResult, output_file: Path) -> None:
    """A command's output: ``$FIREPOOL_OUTPUT_FILE`` as JSON, else as text; none if absent."""
    try:
        with output_file.open("rb") as src:
            raw = src.read(MAX_OUTPUT_BYTES + 1)
    except OSError:
        result.state = AttemptState.SUCCEEDED
        return
    if len(raw) > MAX_OUTPUT_BYTES:
        result.state = AttemptState.FAILED
        cap = MAX_OUTPUT_BYTES
        result.fail(ErrorClass.FUNCTION_ERROR, f"the job's output is over the {cap}-byte cap")
        return
    try:
        output = orjson.loads(raw)
    except orjson.JSONDecodeError:
        output = raw.decode("utf-8", "replace")
    result.state, result.output = AttemptState.SUCCEEDED, output
