"""The zygote: a warm interpreter that imported the pool's ``preload`` modules and forks jobs.

Started by the agent as ``python -P -m pod_runtime.zygote --preload a,b`` with a socket on
stdin/stdout (newline-delimited JSON, one request at a time) and the agent log on stderr.

Protocol (zygote → agent): ``{"event": "ready", "preloaded": [...]}`` once, then for each
``{"op": "spawn", "cfg": {...}}`` a ``{"event": "spawned", "pid": P}`` written *before* any
``{"event": "exit", "pid": P, "status": S}`` for it (raw ``waitpid`` status), and for each
``{"op": "prefork"}`` a ``{"event": "preforked", "pid": P}`` naming the spare child.

Invariants and fork-safety:

* Single-threaded, no CUDA: preloaded modules must not start threads or open a CUDA context at
  import (threads do not survive ``fork``; a CUDA context cannot be forked). After preloading,
  the zygote reports the ``libcuda`` mappings it finds so the agent can warn.
* The zygote is a child subreaper: orphans of a job (double-fork, ``setsid`` daemons) reparent
  to it, it reaps every child, and the agent counts all its descendants as job processes.
* A forked child closes every inherited descriptor above 2 before user code (``job_main``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import importlib
import os
import select
import signal
import sys
from typing import Any

import orjson

from pod_runtime.job_main import run_forked

PR_SET_CHILD_SUBREAPER = 36


def set_child_subreaper() -> bool:
    """Make orphaned descendants reparent to this process (Linux >= 3.4)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def cuda_mapped() -> list[str]:
    """Shared objects of the CUDA driver mapped into this process (should be none)."""
    try:
        with open("/proc/self/maps") as maps:
            return sorted({line.split()[-1] for line in maps if "libcuda" in line})
    except OSError:
        return []


def warm_up() -> None:
    """Touch, in a spare child, what every job start touches, so its copy-on-write page
    faults happen while the pod is idle instead of on the next job's critical path."""
    sample = {"env": dict(os.environ), "sys_path": list(sys.path), "n": [1.5, "x", None]}
    orjson.loads(orjson.dumps(sample))
    for name in list(os.environ)[:1]:
        os.environ[name] = os.environ[name]
    importlib.invalidate_caches()
    gc.collect()


def _send(message: dict[str, Any]) -> None:
    data = orjson.dumps(message) + b"\n"
    while data:
        data = data[os.write(1, data) :]


class Zygote:
    """The fork loop. Owns fds 0/1 (control socket) and a self-pipe for SIGCHLD.

    ``spare`` is a child forked ahead of time (``prefork``, sent by the agent when the pod is
    idle after a reset) that blocks on a pipe until it is handed a job's config, taking the
    fork off the job's critical path. It has run no user code and holds none of the zygote's
    descriptors except its own pipe.
    """

    def __init__(self) -> None:
        self.jobs: set[int] = set()
        self.spare: tuple[int, int] | None = None
        self.spare_cgroup: str | None = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.set_wakeup_fd(self.wake_w)

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if self.spare is not None and pid == self.spare[0]:
                os.close(self.spare[1])
                self.spare = None
            if pid in self.jobs:
                self.jobs.discard(pid)
                _send({"event": "exit", "pid": pid, "status": status})

    def _await_config(self, cfg_r: int, cgroup_procs: str | None) -> None:
        """In a spare child: join the next job's cgroup, drop the zygote's descriptors,
        pre-fault, wait for a config, run it."""
        if cgroup_procs:
            with contextlib.suppress(OSError), open(cgroup_procs, "w") as procs:
                procs.write(str(os.getpid()))
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.closerange(3, cfg_r)
        os.closerange(cfg_r + 1, 1 << 16)
        warm_up()
        chunks = []
        while chunk := os.read(cfg_r, 1 << 20):
            chunks.append(chunk)
        if not chunks:
            os._exit(0)
        run_forked(orjson.loads(b"".join(chunks)))

    def prefork(self, cgroup_procs: str | None) -> None:
        if self.spare is not None:
            _send({"event": "preforked", "pid": self.spare[0]})
            return
        cfg_r, cfg_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            self._await_config(cfg_r, cgroup_procs)
        os.close(cfg_r)
        self.spare = (pid, cfg_w)
        self.spare_cgroup = cgroup_procs
        _send({"event": "preforked", "pid": pid})

    def spawn(self, cfg: dict[str, Any]) -> None:
        if self.spare is not None:
            pid, cfg_w = self.spare
            self.spare = None
            if cfg.get("cgroup_procs") == self.spare_cgroup:
                cfg = {**cfg, "cgroup_procs": None}  # already there
            data = orjson.dumps(cfg)
            try:
                while data:
                    data = data[os.write(cfg_w, data) :]
            except BrokenPipeError:  # the spare died: fork afresh
                pid = 0
            finally:
                os.close(cfg_w)
            if pid:
                self.jobs.add(pid)
                _send({"event": "spawned", "pid": pid})
                return
        pid = os.fork()
        if pid == 0:
            run_forked(cfg)
        self.jobs.add(pid)
        _send({"event": "spawned", "pid": pid})

    def serve(self) -> None:
        buf = b""
        while True:
            ready, _, _ = select.select([0, self.wake_r], [], [])
            if self.wake_r in ready:
                with contextlib.suppress(BlockingIOError):
                    while os.read(self.wake_r, 512):
                        pass
                self.reap()
            if 0 in ready:
                data = os.read(0, 1 << 20)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    request = orjson.loads(line)
                    if request.get("op") == "spawn":
                        self.spawn(request["cfg"])
                    elif request.get("op") == "prefork":
                        self.prefork(request.get("cgroup_procs"))
            self.reap()


def main() -> None:
    parser = argparse.ArgumentParser(prog="pod_runtime.zygote")
    parser.add_argument("--preload", default="")
    args = parser.parse_args()
    loaded = []
    for name in (m.strip() for m in args.preload.split(",")):
        if not name:
            continue
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:  # a broken preload must not take the pod down
            print(f"zygote: cannot preload {name}: {exc!r}", file=sys.stderr, flush=True)
    subreaper = set_child_subreaper()
    gc.freeze()  # preloaded objects: never scanned again, so forks do not copy their pages
    zygote = Zygote()
    _send({"event": "ready", "preloaded": loaded, "cuda": cuda_mapped(), "subreaper": subreaper})
    zygote.serve()


if __name__ == "__main__":
    main()
