"""Real pod agents on unix sockets, and builders for packages and job bodies."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from pod_runtime.cgroups import kill_pod
from pod_runtime.launch import agent_command
from pod_runtime.localpod import UnixHTTPConnection
from tests.conftest import require_sandbox

ROOT = Path(__file__).resolve().parents[2]


class AgentProcess:
    """One ``python -m pod_runtime.agent`` process and a tiny blocking JSON client."""

    def __init__(
        self,
        pod_dir: Path,
        *extra: str,
        sandbox: bool = False,
        network: bool = True,
        drop_jobs: bool = True,
        pod_name: str | None = None,
    ) -> None:
        """``sandbox``: under bubblewrap (the test skips where there is none, or fails under
        ``FIREPOOL_REQUIRE_SANDBOX=1``: ``require_sandbox``). ``pod_name``: the agent's pod
        name (default: the directory's name and a random suffix)."""
        if sandbox:
            require_sandbox()
        self.pod_dir = pod_dir
        self.socket = pod_dir / "agent.sock"
        self.name = pod_name or f"{pod_dir.name}-{uuid.uuid4().hex[:8]}"
        pod_dir.mkdir(parents=True, exist_ok=True)
        listen = f"unix:{self.socket}"
        if sandbox:
            base = agent_command(
                pod_name=self.name,
                pod_dir=pod_dir,
                listen=listen,
                sandbox=True,
                network=network,
                drop_jobs=drop_jobs,
            )
        else:
            base = [
                sys.executable,
                "-P",
                "-m",
                "pod_runtime.agent",
                "--pod-name",
                self.name,
                "--pod-dir",
                str(pod_dir),
                "--listen",
                listen,
            ]
        self.argv = [*base, *extra]
        self.log = open(pod_dir / "agent.log", "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                status, _ = self.call("GET", "/healthz", timeout=1.0)
                if status == 200:
                    break
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError((pod_dir / "agent.log").read_text())
            time.sleep(0.02)

    def call(
        self, method: str, path: str, body: Any = None, timeout: float = 60.0
    ) -> tuple[int, Any]:
        conn = UnixHTTPConnection(str(self.socket), timeout)
        try:
            data = orjson.dumps(body) if body is not None else None
            conn.request(method, path, body=data)
            resp = conn.getresponse()
            raw = resp.read()
            return resp.status, orjson.loads(raw) if raw else None
        finally:
            conn.close()

    def run(self, spec: dict[str, Any], timeout: float = 60.0) -> dict[str, Any]:
        status, body = self.call("POST", "/attempts", {**spec, "wait": True}, timeout)
        assert status == 200, body
        return body

    def reset(self, **body: Any) -> dict[str, Any]:
        status, report = self.call("POST", "/reset", body)
        assert status == 200, report
        return report

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def make_zip(path: Path, files: dict[str, str | bytes]) -> tuple[str, str]:
    """Write a package zip; return (file:// url, sha256)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in files.items():
            zf.writestr(name, content)
    return path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest()


def proc_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            data = stat.read()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :][:1] not in (b"Z", b"X")


@pytest.fixture(scope="module")
def agent_factory(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., AgentProcess]]:
    started: list[AgentProcess] = []

    def start(
        *extra: str,
        name: str = "pod",
        sandbox: bool = False,
        network: bool = True,
        drop_jobs: bool = True,
    ) -> AgentProcess:
        agent = AgentProcess(
            tmp_path_factory.mktemp(name),
            *extra,
            sandbox=sandbox,
            network=network,
            drop_jobs=drop_jobs,
        )
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.stop()
        kill_pod(agent.pod_dir)


@pytest.fixture(scope="module")
def agent(agent_factory: Callable[..., AgentProcess]) -> AgentProcess:
    return agent_factory()


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The standard test package: {"url", "digest"} of jobs.py (see JOBS)."""
    url, digest = make_zip(tmp_path_factory.mktemp("pkg") / "jobs.zip", {"jobs.py": JOBS})
    return {"url": url, "digest": digest}


JOBS = """
import asyncio, os, subprocess, sys, time

def echo(x):
    print("echo says", x, flush=True)
    return {"input": x, "cwd": os.getcwd(), "env": {k: v for k, v in os.environ.items()}}

async def double(x):
    await asyncio.sleep(0)
    return x * 2

def boom(x):
    raise ValueError(f"bad input {x}")

def unserializable(x):
    return {"set": {1, 2}}

def result_dir(x):
    # job_main cannot write the result (a full disk does the same): its own failure
    os.mkdir(os.path.join(os.path.dirname(os.environ["FIREPOOL_OUTPUT_FILE"]), "result.json"))
    return "lost"

def not_finite(x):
    value = float(x)
    if os.environ.get("USE_NUMPY"):
        import numpy
        return {"loss": numpy.array([1.0, numpy.float32(value)])}
    return {"loss": [None, 1.5, {"deep": value}]}

class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no message")

def bad_str(x):
    raise Unprintable()

def exit_code(x):
    os._exit(x)

def sleep(x):
    print("sleeping", flush=True)
    time.sleep(x)
    return "woke"

def daemon(x):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
    return p.pid

def daemon_then_sleep(path):
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
    with open(path, "w") as f:
        f.write(str(p.pid))
    time.sleep(600)

def chatty(x):
    for i in range(x):
        print(f"line {i}", flush=True)
    return x
"""
