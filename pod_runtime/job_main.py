"""The first code of a job process: set the process up, then run the user's code.

Runs either in a child forked from the zygote (``run_forked``) or as a fresh interpreter
(``python -P -m pod_runtime.job_main CONFIG``). Both end in ``_run``, which never returns:

1. become a session leader, join the job's cgroup (if any) so every descendant is tracked,
2. stdio to the attempt log (the agent caps it when the job exits), the job environment,
   the package directory as cwd and on ``sys.path`` (after the dependency dir), stdout
   line-buffered so logs stream,
3. record ``first_instruction`` (the wall time just before user code) in its own file,
4. entrypoint mode: import ``mod``, call ``fn(input)``, await a coroutine, check the return
   value (JSON, at most ``MAX_NESTING`` deep and ``MAX_OUTPUT_BYTES`` long), write
   ``{"ok": true, "output": ...}`` or ``{"ok": false, "type", "message", "traceback"}`` to the
   result file and ``os._exit`` (0 or 1) without running interpreter teardown;
   command mode: ``execvpe`` the argv (the agent reads ``$FIREPOOL_OUTPUT_FILE`` after exit).

Nothing here may import CUDA or touch the agent's sockets; the config is plain JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import os
import signal
import sys
import time
import traceback
from typing import Any, NoReturn

import orjson

# ``functions.nesting``'s limits, copied: this module imports nothing of ours, since a job's
# own modules (on ``sys.path`` first) may be named like ours. A test checks they agree.
MAX_NESTING = 128
ORJSON_MAX_DEPTH = 254

MAX_OUTPUT_BYTES = 16 * 1024 * 1024
"""Largest return value, serialized as JSON; a larger one fails the job with
``FunctionError`` naming its size and this cap. The broker's largest JSON request body
(``gateway.settings.Settings.max_json_bytes``), so an output is never bigger than an input
could have been; a test checks they agree (copied: see above). The agent applies it again
when it reads the result, and to a command's ``$FIREPOOL_OUTPUT_FILE``."""

TRACEBACK_LINES = 40
TRACEBACK_CHARS = 8000
MESSAGE_CHARS = 8000
"""Longest exception message a result carries (its start and a count of what was cut); the
whole message is in the job's log."""


def _write(path: str, data: bytes) -> None:
    """No rename needed: the agent reads these files only after the process has exited."""
    with open(path, "wb") as out:
        out.write(data)


def _setup(cfg: dict[str, Any], *, forked: bool) -> None:
    with contextlib.suppress(PermissionError):
        os.setsid()
    cgroup_procs = cfg.get("cgroup_procs")
    if cgroup_procs:  # best effort: without it the agent still tracks the job via /proc
        with contextlib.suppress(OSError), open(cgroup_procs, "w") as procs:
            procs.write(str(os.getpid()))
    if forked:
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.set_wakeup_fd(-1)
        log_fd = os.open(cfg["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null_fd, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.closerange(3, 1 << 16)
        sys.argv = [cfg.get("entrypoint") or cfg["command"][0]]
    env = cfg["env"]
    for name in [k for k in os.environ if k not in env]:  # a diff: most of it is unchanged
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value
    os.chdir(cfg["pkg_dir"])
    for extra in reversed([cfg["pkg_dir"], *cfg.get("sys_path", [])]):
        sys.path.insert(0, extra)
    importlib.invalidate_caches()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]


def _mark_first_instruction(cfg: dict[str, Any]) -> None:
    _write(cfg["first_instruction"], repr(time.time()).encode())


def _flush_and_exit(code: int) -> NoReturn:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _failure(exc: BaseException, prefix: str = "") -> dict[str, Any]:
    lines = "".join(traceback.format_exception(exc)).splitlines()
    tail = "\n".join(lines[-TRACEBACK_LINES:])[-TRACEBACK_CHARS:]
    try:
        text = str(exc)
    except Exception:  # an exception whose __str__ raises still fails as FunctionError
        text = f"<{type(exc).__name__} whose message could not be printed>"
    message = prefix + text
    if len(message) > MESSAGE_CHARS:
        cut = len(message) - MESSAGE_CHARS
        message = f"{message[:MESSAGE_CHARS]} ... [{cut} more characters in the log]"
    return {"ok": False, "type": type(exc).__name__, "message": message, "traceback": tail}


def _call_entrypoint(cfg: dict[str, Any]) -> dict[str, Any]:
    module_name, _, attr = cfg["entrypoint"].partition(":")
    with open(cfg["input"], "rb") as src:
        payload = orjson.loads(src.read())
    _mark_first_instruction(cfg)
    try:
        fn = getattr(importlib.import_module(module_name), attr)
        output = fn(payload)
        if inspect.isawaitable(output):
            output = asyncio.run(_await(output))
    except BaseException as exc:  # the user's failure, whatever it is, becomes the result
        traceback.print_exception(exc)
        return _failure(exc)
    try:
        size = len(orjson.dumps(output, option=orjson.OPT_SERIALIZE_NUMPY))
    except TypeError as exc:
        return _failure(exc, "return value is not JSON-serializable: ")
    if size > MAX_OUTPUT_BYTES:
        too_big = ValueError(
            f"return value is {size} bytes as JSON, over the {MAX_OUTPUT_BYTES}-byte cap"
        )
        return _failure(too_big)
    if nests_too_deep(output):
        too_deep = ValueError(f"return value nests more than {MAX_NESTING} levels deep")
        return _failure(too_deep)
    return {"ok": True, "output": output}


def nests_too_deep(output: Any) -> bool:
    """Whether ``output`` nests deeper than ``MAX_NESTING`` (the hops after this one nest it
    deeper still: functions/nesting.py). The agent asks too, of a result it did not see
    this module write."""
    probe = output
    for _ in range(ORJSON_MAX_DEPTH - MAX_NESTING):
        probe = [probe]
    try:
        orjson.dumps(probe, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError:
        return True
    return False


def _run(cfg: dict[str, Any], *, forked: bool) -> NoReturn:
    code = 1
    try:
        _setup(cfg, forked=forked)
        if cfg.get("command"):
            _mark_first_instruction(cfg)
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            try:
                os.execvpe(cfg["command"][0], cfg["command"], os.environ)
            except OSError as exc:
                print(f"firepool: cannot run {cfg['command'][0]!r}: {exc}", file=sys.stderr)
                _flush_and_exit(127)
        result = _call_entrypoint(cfg)
        data = orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
        _write(cfg["result"], data)
        code = 0 if result["ok"] else 1
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
        code = 70
    _flush_and_exit(code)


def run_forked(cfg: dict[str, Any]) -> NoReturn:
    """Entry in a child just forked from the zygote."""
    _run(cfg, forked=True)


def main() -> NoReturn:
    """Entry of ``python -P -m pod_runtime.job_main CONFIG`` (exec mode)."""
    with open(sys.argv[1], "rb") as src:
        cfg = orjson.loads(src.read())
    _run(cfg, forked=False)


if __name__ == "__main__":
    main()
