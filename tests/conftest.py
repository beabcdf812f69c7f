"""Shared test fixtures: a real broker process on loopback with its own state directory.

``broker_server`` starts ``firepool serve`` as a subprocess (real HTTP, real SQLite, real pod
agent processes) and, on teardown, stops it and kills every pod it left behind (pods outlive
the broker by design).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from functions.sdk import Client
from gateway.auth import Authenticator, Role, load_or_create_key

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "functions"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_pods(home: Path) -> None:
    """SIGKILL every local pod under ``home`` (their process groups)."""
    for meta_path in (home / "pods").glob("*/pod.json"):
        with contextlib.suppress(Exception):
            pid = json.loads(meta_path.read_text()).get("pid")
            if isinstance(pid, int):
                os.killpg(pid, signal.SIGKILL)


@dataclass
class BrokerServer:
    url: str
    home: Path
    proc: subprocess.Popen[bytes]
    auth: Authenticator

    def token(self, caller: str, role: Role = Role.INVOKE, ttl_s: int = 3600) -> str:
        return self.auth.mint(caller, role, ttl_s)

    def client(self, caller: str, role: Role = Role.INVOKE) -> Client:
        return Client(self.url, self.token(caller, role), timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_broker(home: Path, catalog: str | None = None, port: int | None = None,
                 extra_env: dict[str, str] | None = None) -> BrokerServer:
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    env = dict(os.environ, FIREPOOL_HOME=str(home), **(extra_env or {}))
    if catalog is not None:
        (home / "catalog.yaml").write_text(catalog)
        env["FIREPOOL_CATALOG"] = str(home / "catalog.yaml")
    log = open(home / "broker.log", "ab")  # noqa: SIM115 - closed by the child's lifetime
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited: {(home / 'broker.log').read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        time.sleep(0.05)
    else:
        proc.kill()
        raise RuntimeError("broker never became ready")
    auth = Authenticator(load_or_create_key(home / "signing.key"))
    return BrokerServer(url=url, home=home, proc=proc, auth=auth)


def deploy_examples(server: BrokerServer, names: dict[str, str]) -> None:
    with server.client("deployer", Role.DEPLOY) as fp:
        for name, entrypoint in names.items():
            fp.deploy(EXAMPLES / name, name=name, sku="cpu", entrypoint=entrypoint, timeout_s=30)


@pytest.fixture(scope="module")
def broker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    home = tmp_path_factory.mktemp("firepool")
    catalog = (
        "budgets: {cpu: 16}\n"
        "pools:\n"
        "  cpu: {min_count: 1, max_idle_count: 2, max_count: 8, idle_timeout_s: 120}\n"
    )
    server = start_broker(home, catalog)
    try:
        deploy_examples(server, {"noop": "noop:noop"})
        yield server
    finally:
        server.stop()
        kill_pods(home)
