"""One local pod agent process and a blocking JSON client for it (benchmarks, debugging).

``LocalPod.start`` spawns ``launch.agent_command(...)`` in a new session, waits for
``GET /healthz`` and returns; ``stop`` sends SIGTERM (the launcher's shell then
``cgroup.kill``s the pod when there is a pod cgroup), waits, and removes the pod cgroup.
Not thread-safe; one caller at a time. The broker uses its own asyncio client.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from pod_runtime.cgroups import kill_pod
from pod_runtime.launch import agent_command


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a unix socket."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("pod", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class LocalPod:
    """A pod agent process under ``pod_dir`` listening on ``pod_dir/agent.sock``."""

    def __init__(self, name: str, pod_dir: Path, argv: Sequence[str]) -> None:
        self.name = name
        self.pod_dir = pod_dir
        self.socket = pod_dir / "agent.sock"
        self.argv = list(argv)
        self.proc: subprocess.Popen[bytes] | None = None
        self._conn: UnixHTTPConnection | None = None

    @classmethod
    def start(
        cls, name: str, pod_dir: Path, *extra: str, timeout_s: float = 60.0, **launch: Any
    ) -> LocalPod:
        pod_dir.mkdir(parents=True, exist_ok=True)
        argv = agent_command(
            pod_name=name, pod_dir=pod_dir, listen=f"unix:{pod_dir / 'agent.sock'}", **launch
        )
        pod = cls(name, pod_dir, [*argv, *extra])
        with open(pod_dir / "agent.log", "ab") as log:
            pod.proc = subprocess.Popen(
                pod.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError, http.client.HTTPException):
                if pod.call("GET", "/healthz", timeout=1.0)[0] == 200:
                    return pod
            if pod.proc.poll() is not None or time.monotonic() > deadline:
                pod.stop()
                raise RuntimeError(f"pod {name} did not start: see {pod_dir / 'agent.log'}")
            time.sleep(0.02)

    def call(
        self, method: str, path: str, body: Any = None, timeout: float = 600.0
    ) -> tuple[int, Any]:
        """One request on a kept-alive connection (reconnects once if it was closed)."""
        data = orjson.dumps(body) if body is not None else None
        for attempt in range(2):
            if self._conn is None:
                self._conn = UnixHTTPConnection(str(self.socket), timeout)
            self._conn.timeout = timeout
            try:
                self._conn.request(method, path, body=data)
                resp = self._conn.getresponse()
                raw = resp.read()
                return resp.status, orjson.loads(raw) if raw else None
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt == 1:
                    raise
        raise AssertionError("unreachable")

    def run(self, spec: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
        status, body = self.call("POST", "/attempts", {**spec, "wait": True}, timeout)
        if status != 200:
            raise RuntimeError(f"POST /attempts answered {status}: {body}")
        return dict(body)

    def reset(self, **body: Any) -> dict[str, Any]:
        status, report = self.call("POST", "/reset", body)
        if status != 200:
            raise RuntimeError(f"POST /reset answered {status}: {report}")
        return dict(report)

    def stop(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        kill_pod(self.pod_dir)
