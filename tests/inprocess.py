"""A whole broker in the test's own event loop, for fast HTTP-edge tests.

``inprocess_broker`` builds ``Broker(Settings(backend="fake", ...))``, runs the real app's
lifespan (``broker.start``/``stop``) and serves the real Starlette app through
``httpx.ASGITransport``: real routes, auth, decoding, job store (SQLite in ``tmp_path``),
dispatcher, executor and agent protocol; no port, no broker process and no process per pod.
Pods are the fake backend's (``pool_manager/backends/fake.py`` lists what they do not
emulate: no isolation, ``os.environ`` not per job, no requirements installs, no GPUs...);
tests of those keep running against ``conftest.running_broker``'s real processes.

    async def test_noop_answers_its_input(tmp_path: Path) -> None:
        async with inprocess_broker(tmp_path) as fp:
            await fp.deploy(EXAMPLES / "noop", name="noop", entrypoint="noop:noop")
            answer = await fp.client.post("/v1/functions/noop:invoke", json={"input": 7},
                                          headers=fp.headers("alice"))
            assert answer.json()["output"] == 7

The API is ``InProcessBroker`` and ``inprocess_broker``'s arguments; keep it
that small (reach ``fp.broker`` only for what HTTP cannot show).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from broker.service import Broker
from broker.settings import Settings
from functions.packaging import package_digest
from gateway.app import create_app
from gateway.auth import Authenticator, Role
from pool_manager.backends.fake import FakeBackend

BASE_URL = "http://firepool.test"


@dataclass
class InProcessBroker:
    broker: Broker
    """The running broker (its settings, backend, store...)."""
    client: httpx.AsyncClient
    """Talks to the app in-process; send ``headers(caller)`` with each request."""
    authenticator: Authenticator

    def headers(self, caller: str, role: Role = Role.INVOKE) -> dict[str, str]:
        """The ``Authorization`` header of a fresh token for ``caller`` with ``role``."""
        return {"Authorization": f"Bearer {self.authenticator.mint(caller, role, 3600)}"}

    async def deploy(
        self,
        directory: Path,
        *,
        name: str,
        entrypoint: str | None = None,
        sku: str = "cpu",
        caller: str = "deployer",
        **fields: Any,
    ) -> dict[str, Any]:
        """Upload ``directory`` as a package and register function ``name`` on it, as
        ``caller`` with the deploy role (``firepool deploy``'s two requests); ``fields`` are
        more of ``POST /v1/functions``'s (``command``, ``timeout_s``, ``env``...). Returns the
        registration's answer; raises ``httpx.HTTPStatusError`` if either request fails."""
        digest, data = package_digest(directory)
        headers = self.headers(caller, Role.DEPLOY)
        upload = await self.client.put(f"/v1/packages/{digest}", content=data, headers=headers)
        upload.raise_for_status()
        body = {"name": name, "sku": sku, "package_digest": digest, **fields}
        if entrypoint is not None:
            body["entrypoint"] = entrypoint
        registered = await self.client.post("/v1/functions", json=body, headers=headers)
        registered.raise_for_status()
        result: dict[str, Any] = registered.json()
        return result


@contextlib.asynccontextmanager
async def inprocess_broker(
    tmp_path: Path, catalog: str | None = None, **settings: Any
) -> AsyncIterator[InProcessBroker]:
    """A started broker on fake pods with its home in ``tmp_path``; stopped afterwards and
    every fake pod with it. ``catalog``: the pool catalog's YAML (default: one ``cpu`` pool);
    ``settings``: more ``Settings`` fields (``backend`` may be overridden too)."""
    home = tmp_path / "firepool"
    if catalog is not None:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        (home / "catalog.yaml").write_text(catalog)
        settings.setdefault("catalog_path", home / "catalog.yaml")
    settings.setdefault("backend", "fake")
    broker = Broker(Settings(home=home, **settings))
    app = create_app(broker)
    try:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as client:
                auth = Authenticator(broker.signing_key, broker.settings.audience)
                yield InProcessBroker(broker, client, auth)
    finally:
        if isinstance(broker.backend, FakeBackend):
            await broker.backend.shutdown()
