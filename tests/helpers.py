"""Helpers shared by test modules (fixtures live in the conftest files).

``threaded_broker``: the real broker served by uvicorn in a thread of the test process, over
real HTTP on loopback. On local pods, it is for tests that patch a part of the broker to
inject a fault (the broker processes of ``gateway.harness`` cannot be patched from outside);
on fake pods (``backend="fake"``, ``pool_manager/backends/fake.py`` lists what they do not
emulate), it serves the HTTP-edge tests without a broker process or a process per pod, and
with the SDK's own client (``tests/inprocess.py`` is the same broker over
``httpx.ASGITransport``, for async tests). ``make_wheel``: a tiny wheel for dependency
installs.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import threading
import time
import zipfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette

from broker.keys import load_or_create_key
from broker.service import Broker
from broker.settings import Settings
from functions.sdk import Client
from gateway.app import create_app
from gateway.auth import Authenticator, Role
from gateway.harness import free_port, kill_pods
from pod_runtime.agent_auth import agent_key, bearer, pod_secret
from pod_runtime.localpod import UnixHTTPConnection
from pool_manager.backends.fake import FakeBackend


@dataclass
class ThreadedBroker:
    """A broker served in this process (``threaded_broker``); its interface matches the
    subprocess ``gateway.harness.BrokerServer`` where a test needs no process of its own."""

    broker: Broker
    """The running broker, for a test to patch or read what HTTP cannot show."""
    url: str

    @property
    def home(self) -> Path:
        return self.broker.settings.home

    @property
    def auth(self) -> Authenticator:
        return Authenticator(self.broker.signing_key, self.broker.settings.audience)

    def token(self, caller: str, role: Role = Role.INVOKE, ttl_s: int = 3600) -> str:
        """A token for ``caller`` with ``role`` from the broker's key."""
        return self.auth.mint(caller, role, ttl_s)

    def client(self, caller: str, role: Role = Role.INVOKE) -> Client:
        """An SDK client for ``caller`` with ``role``."""
        return Client(self.url, self.token(caller, role), timeout=60)


ONE_CPU_POOL = "pools:\n  cpu: {min_count: 0, max_count: 4}\n"


@contextlib.contextmanager
def threaded_broker(
    home: Path, catalog: str = ONE_CPU_POOL, keep_pods: bool = False, **settings: Any
) -> Iterator[ThreadedBroker]:
    """A broker (``catalog``: its pool catalog's YAML; ``settings``: more ``Settings``
    fields, ``backend="fake"`` for fake pods) served by uvicorn on a loopback port in a
    thread of this process. Stopped afterwards, and its pods with it: local pods are killed
    unless ``keep_pods`` (for a broker started after it on ``home``); fake pods, which live in
    the server's event loop, are always stopped there."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.yaml").write_text(catalog)
    settings.setdefault("catalog_path", home / "catalog.yaml")
    broker = Broker(Settings(home=home, port=free_port(), **settings))
    app = create_app(broker)
    serve = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            async with serve(app):
                yield
        finally:
            if isinstance(broker.backend, FakeBackend):
                await broker.backend.shutdown()

    app.router.lifespan_context = lifespan
    config = uvicorn.Config(
        app, host=broker.settings.host, port=broker.settings.port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the broker did not start"
        time.sleep(0.01)
    try:
        yield ThreadedBroker(broker, broker.settings.resolved_public_url)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        if not keep_pods and not isinstance(broker.backend, FakeBackend):
            kill_pods(home)


def agent_headers(home: Path, pod: str) -> dict[str, str]:
    """What a call to pod ``pod``'s agent must carry: its secret, derived from the signing key
    of the broker whose home is ``home`` (``pod_runtime.agent_auth``)."""
    key = agent_key(load_or_create_key(home / "signing.key"))
    return bearer(pod_secret(key, pod))


def agent_health(home: Path, pod: str) -> dict[str, Any]:
    """The ``/healthz`` answer of local pod ``pod``'s agent (its endpoint from the pod's
    record under ``home``): ``attempts`` lists the attempts it holds."""
    endpoint = json.loads((home / "pods" / f"{pod}.json").read_text())["endpoint"]
    agent = UnixHTTPConnection(endpoint.removeprefix("unix:"), 10.0)
    try:
        agent.request("GET", "/healthz", headers=agent_headers(home, pod))
        answer: dict[str, Any] = json.loads(agent.getresponse().read())
        return answer
    finally:
        agent.close()


def wait_at_agent(home: Path, job: dict[str, Any], timeout_s: float = 30.0) -> str:
    """Wait until ``job``'s last attempt (a RUNNING job's record, on a broker whose home is
    ``home``) is held by its first pod's agent: launched there, no longer only claimed (a
    broker killed before the launch re-queues the job; after it, it re-attaches). Returns
    the pod."""
    attempt = job["attempts"][-1]
    pod = str(attempt["pods"][0])
    deadline = time.monotonic() + timeout_s
    while attempt["id"] not in agent_health(home, pod)["attempts"]:
        assert time.monotonic() < deadline, f"{attempt['id']} never reached the agent of {pod}"
        time.sleep(0.02)
    return pod


def make_wheel(directory: Path, value: str, extra: dict[str, bytes] | None = None) -> Path:
    """A minimal pure-Python wheel ``demo_pkg`` whose ``VALUE`` is ``value``; ``extra``: more
    files, installed at the top of the target as they are named."""
    files = {
        **(extra or {}),
        "demo_pkg/__init__.py": f"VALUE = {value!r}\n".encode(),
        "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
        "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},{len(data)}"
        for name, data in files.items()
    ]
    files["demo_pkg-1.0.dist-info/RECORD"] = ("\n".join(record) + "\nRECORD,,\n").encode()
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return wheel
