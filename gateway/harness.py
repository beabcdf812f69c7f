"""Run a real broker as a subprocess on loopback: for tests, benchmarks and examples.

``start_broker`` launches ``firepool serve`` with its own state directory and waits until it
answers ``/readyz``; ``BrokerServer.stop`` stops it gracefully; ``kill_pods`` removes the
local pods it leaves behind (pods outlive the broker by design).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from functions.sdk import Client
from gateway.auth import Authenticator, Role, load_or_create_key
from pool_manager.backends.local import stop_pod

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_pods(home: Path) -> None:
    """Stop every local pod under ``home`` (they outlive the broker by design)."""
    for meta in sorted((home / "pods").glob("*.json")):
        stop_pod(meta.with_suffix(""))


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

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the broker (crash tests); its pods keep running."""
        self.proc.kill()
        self.proc.wait()

    def log(self) -> str:
        return (self.home / "broker.log").read_text(errors="replace")


def wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"broker exited {proc.returncode}: {log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"broker never became ready: {log.read_text()[-3000:]}")


def start_broker(
    home: Path,
    catalog: str | None = None,
    port: int | None = None,
    extra_env: dict[str, str] | None = None,
) -> BrokerServer:
    """Start ``firepool serve`` with state in ``home`` and an optional YAML catalog."""
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    port = port or free_port()
    env = dict(os.environ, FIREPOOL_HOME=str(home), **(extra_env or {}))
    if catalog is not None:
        (home / "catalog.yaml").write_text(catalog)
        env["FIREPOOL_CATALOG"] = str(home / "catalog.yaml")
    log_path = home / "broker.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, log_path)
    auth = Authenticator(load_or_create_key(home / "signing.key"))
    return BrokerServer(url=url, home=home, proc=proc, auth=auth)
