"""Helpers shared by test modules (fixtures live in the conftest files).

``threaded_broker``: the real broker served by uvicorn in a thread of the test process, on
real local pods, for tests that patch a part of the broker to inject a fault (the broker
processes of ``gateway.harness`` cannot be patched from outside; ``tests/inprocess.py`` is
the faster broker on fake pods for tests that need no real pod). ``make_wheel``: a tiny wheel
for dependency installs.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from broker.service import Broker
from broker.settings import Settings
from functions.sdk import Client
from gateway.app import create_app
from gateway.auth import Authenticator, Role
from gateway.harness import free_port, kill_pods


@dataclass
class ThreadedBroker:
    broker: Broker
    """The running broker, for a test to patch or read what HTTP cannot show."""
    url: str

    def token(self, caller: str, role: Role = Role.INVOKE) -> str:
        """A token for ``caller`` with ``role``, valid for an hour, from the broker's key."""
        return Authenticator(self.broker.signing_key).mint(caller, role, 3600)

    def client(self, caller: str, role: Role = Role.INVOKE) -> Client:
        """An SDK client for ``caller`` with ``role``."""
        return Client(self.url, self.token(caller, role), timeout=60)


@contextlib.contextmanager
def threaded_broker(home: Path, keep_pods: bool = False) -> Iterator[ThreadedBroker]:
    """A broker with one CPU pool (at most 4 pods, none kept idle) served by uvicorn in a
    thread; stopped, and its pods killed (unless ``keep_pods``, for a broker started after it
    on ``home``), afterwards."""
    catalog = home / "catalog.yaml"
    home.mkdir(parents=True, exist_ok=True)
    catalog.write_text("pools:\n  cpu: {min_count: 0, max_count: 4}\n")
    settings = Settings(home=home, port=free_port(), catalog_path=catalog)
    broker = Broker(settings)
    config = uvicorn.Config(
        create_app(broker), host=settings.host, port=settings.port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the broker did not start"
        time.sleep(0.02)
    try:
        yield ThreadedBroker(broker, settings.resolved_public_url)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        if not keep_pods:
            kill_pods(home)


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
