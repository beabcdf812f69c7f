"""The first code of a job process: set the process up, then run the user's code.

Runs either in a child forked from the zygote (``run_forked``) or as a fresh interpreter
(``python -P -m pod_runtime.job_main CONFIG``). Both end in ``_run``, which never returns:

1. become a session leader, join the job's cgroup (if any) so every descendant is tracked,
   then (in a sandbox started as root) become the job's unprivileged uid for good, and
   refuse keyrings, POSIX message queues and new user namespaces (``refuse_syscalls``),
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
import ctypes
import errno
import importlib
import inspect
import math
import os
import signal
import struct
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
(``broker.settings.Settings.max_json_bytes``), so an output is never bigger than an input
could have been; a test checks they agree (copied: see above). The agent applies it again
when it reads the result, and to a command's ``$FIREPOOL_OUTPUT_FILE``."""

RUNTIME_FAILED = 70
"""Exit code (EX_SOFTWARE) when this module itself fails, not the function: setting the job
up, or recording its result (a full disk). The agent reports it as ``InternalError`` when no
result was written."""

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
    if cfg.get("job_uid") is not None:  # last of what needs root: joined, stdio open
        drop_to(int(cfg["job_uid"]))
        # All this uid may write (its package, scratch, /tmp) the reset empties: bytecode
        # written there would serve no later job, so the imports skip writing it.
        sys.dont_write_bytecode = True
    try:
        refuse_syscalls()
    except OSError as exc:  # a kernel without seccomp filters: say so in the job's log
        print(f"[firepool] no seccomp filter (keyrings, mqueues, user namespaces open): {exc}",
              file=sys.stderr)  # fmt: skip
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


PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
REFUSED_SYSCALLS = (
    # (AUDIT_ARCH_*, a mask for the call's number, the numbers of add_key, request_key,
    #  keyctl, mq_open and unshare, then of clone and clone3)
    (0xC000003E, 0xBFFFFFFF, (248, 249, 250, 240, 272), 56, 435),  # x86_64 and x32 (bit 30)
    (0x40000003, 0xFFFFFFFF, (286, 287, 288, 277, 310), 120, 435),  # i386 (int 0x80)
    (0xC00000B7, 0xFFFFFFFF, (217, 218, 219, 180, 97), 220, 435),  # aarch64
)
"""What a job may not do, by a seccomp filter (Docker's default profile refuses the same):

* the kernel keyrings (``add_key``, ``request_key``, ``keyctl``): a keyring is per uid, not
  per pod, so a key one caller's job stored would be another caller's to read on any pod of
  the same uid, and would outlive the pod;
* POSIX message queues (``mq_open``): they live in the pod's IPC namespace, which a reset
  cannot list (no mqueue filesystem is mounted there), so a queue and its messages would
  reach the next session's job;
* new user namespaces (``unshare``, ``clone`` with ``CLONE_NEWUSER``; ``clone3``, whose flags
  a filter cannot read, answers ``ENOSYS`` so that libc falls back to ``clone``): in one a job
  could mount a tmpfs past its pool's ``tmpfs_mb``, and they are kernel attack surface no job
  needs."""

CLONE_NEWUSER = 0x10000000


def _refusing_filter() -> bytes:
    """A classic-BPF seccomp program for ``REFUSED_SYSCALLS``: ``EPERM`` for each refused call
    of its architecture, every other call allowed. A tiny assembler: jumps name labels."""
    load, jeq, jset, and_k, ret = 0x20, 0x15, 0x45, 0x54, 0x06  # BPF_LD|W|ABS, JMP|JEQ|K, ...
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | errno.EPERM, 0x00050000 | errno.ENOSYS
    code: list[tuple[int, int, int | str, int | str]] = [(load, 4, 0, 0)]  # .arch
    labels: dict[str, int] = {}
    for n, (arch, mask, refused, clone, clone3) in enumerate(REFUSED_SYSCALLS):
        code.append((jeq, arch, 0, f"next{n}"))
        code += [(load, 0, 0, 0), (and_k, mask, 0, 0)]  # .nr
        code += [(jeq, number, f"deny{n}", 0) for number in refused]
        code += [(jeq, clone3, f"enosys{n}", 0), (jeq, clone, f"clone{n}", 0), (ret, allow, 0, 0)]
        labels[f"clone{n}"] = len(code)
        code += [(load, 16, 0, 0), (jset, CLONE_NEWUSER, f"deny{n}", 0), (ret, allow, 0, 0)]
        labels[f"deny{n}"] = len(code)
        code.append((ret, eperm, 0, 0))
        labels[f"enosys{n}"] = len(code)
        code.append((ret, enosys, 0, 0))
        labels[f"next{n}"] = len(code)
    code.append((ret, allow, 0, 0))

    def to(target: int | str, at: int) -> int:
        return target if isinstance(target, int) else labels[target] - at - 1

    return b"".join(
        struct.pack("HBBI", op, to(jt, i), to(jf, i), k) for i, (op, k, jt, jf) in enumerate(code)
    )


REFUSING_FILTER = _refusing_filter()


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


class _SyscallSeal:
    """What ``refuse_syscalls`` needs, made once at import (in the zygote, before any fork): in
    a freshly forked job, loading libc, building the program and the first foreign call take
    ~1.8 ms; the two ``prctl`` calls alone take microseconds."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.prctl = self.libc.prctl
        self.prctl.restype = ctypes.c_int
        self.code = ctypes.create_string_buffer(REFUSING_FILTER, len(REFUSING_FILTER))
        self.program = _Program(len(REFUSING_FILTER) // 8, ctypes.addressof(self.code))
        self.pointer = ctypes.byref(self.program)
        self.prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0)  # the first foreign call: made here


PR_GET_NO_NEW_PRIVS = 39
_SEAL = _SyscallSeal()


def refuse_syscalls() -> None:
    """Install ``REFUSING_FILTER`` for this process and all it starts (``no_new_privs`` first,
    which bwrap has set already). Raises OSError where the kernel refuses."""
    if _SEAL.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
    if _SEAL.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, _SEAL.pointer, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def drop_to(uid: int) -> None:
    """Become ``uid`` (gid the same number, no supplementary groups) for good: real,
    effective and saved ids, which clears every capability. Raises if that did not happen
    (``pod_runtime.jobuser`` uses it too)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getgid() != uid:
        raise PermissionError(f"could not drop to uid {uid}")


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
        data = orjson.dumps(output, option=orjson.OPT_SERIALIZE_NUMPY)
    except TypeError as exc:
        return _failure(exc, "return value is not JSON-serializable: ")
    size = len(data)
    if b"null" in data and holds_non_finite(output):  # orjson wrote each as null
        not_json = ValueError("return value holds NaN or Infinity, which JSON has no form for")
        return _failure(not_json, "return value is not JSON-serializable: ")
    if size > MAX_OUTPUT_BYTES:
        too_big = ValueError(
            f"return value is {size} bytes as JSON, over the {MAX_OUTPUT_BYTES}-byte cap"
        )
        return _failure(too_big)
    if nests_too_deep(output):
        too_deep = ValueError(f"return value nests more than {MAX_NESTING} levels deep")
        return _failure(too_deep)
    return {"ok": True, "output": output}


def holds_non_finite(output: Any) -> bool:
    """Whether ``output`` holds a NaN or an infinity anywhere (numpy's too). orjson writes each
    as ``null``: a function returning ``{"loss": nan}`` would succeed with ``{"loss": None}``,
    where every other value JSON cannot carry fails the job."""
    stack = [output]
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return True
        elif isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
        elif hasattr(value, "tolist") and hasattr(value, "dtype"):  # a numpy array or scalar
            stack.append(value.tolist())
    return False


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
                why = f"cannot run {cfg['command'][0]!r}: {exc.strerror or exc}"
                print(f"firepool: {why}", file=sys.stderr)
                with contextlib.suppress(OSError):  # the reason, for the job's error
                    _write(cfg["result"], orjson.dumps({"ok": False, "message": why}))
                _flush_and_exit(127)
        result = _call_entrypoint(cfg)
        data = orjson.dumps(result, option=orjson.OPT_SERIALIZE_NUMPY)
        _write(cfg["result"], data)
        code = 0 if result["ok"] else 1
    except BaseException:
        with contextlib.suppress(Exception):
            traceback.print_exc()
        code = RUNTIME_FAILED
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
