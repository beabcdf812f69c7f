"""The broker caches each function's latest version; a register or delete racing reads of
the same name must leave the cache agreeing with the store (found by fuzzing: a read that
began before a delete committed cached the deleted function for good, and it stayed
described and invocable while the store had it gone)."""

from __future__ import annotations

import asyncio

import httpx

from functions.packaging import package_digest
from gateway.auth import Role
from tests.conftest import EXAMPLES
from tests.helpers import ThreadedBroker


async def test_a_function_deleted_while_it_is_being_read_stays_deleted(
    fake_pod_broker: ThreadedBroker,
) -> None:
    token = fake_pod_broker.token("cache-dev", Role.DEPLOY)
    headers = {"Authorization": f"Bearer {token}"}
    with fake_pod_broker.client("cache-dev", Role.DEPLOY) as fp:  # the package is theirs too
        digest = fp.upload(package_digest(EXAMPLES / "noop")[1])
    async with httpx.AsyncClient(base_url=fake_pod_broker.url, headers=headers, timeout=60) as c:

        def body(name: str) -> dict[str, str]:
            return {"name": name, "sku": "cpu", "package_digest": digest, "entrypoint": "noop:noop"}

        async def reader(name: str) -> None:
            for _ in range(5):
                await c.get(f"/v1/functions/{name}")

        served_after_delete = []
        stale_versions = []
        for r in range(15):
            name = f"cache-del-{r}"
            assert (await c.post("/v1/functions", json=body(name))).status_code == 201
            deleted, _, _ = await asyncio.gather(
                c.delete(f"/v1/functions/{name}"), reader(name), reader(name)
            )
            assert deleted.status_code == 200
            if (await c.get(f"/v1/functions/{name}")).status_code != 404:
                served_after_delete.append(name)
            name = f"cache-reg-{r}"
            made = await asyncio.gather(
                *(c.post("/v1/functions", json=body(name)) for _ in range(6))
            )
            await reader(name)
            assert all(m.status_code == 201 for m in made)
            cached = (await c.get(f"/v1/functions/{name}")).json()["version"]
            listed = (await c.get("/v1/functions")).json()["functions"]
            latest = max(f["version"] for f in listed if f["name"] == name)
            if cached != latest:
                stale_versions.append((name, cached, latest))
    assert served_after_delete == [] and stale_versions == []
