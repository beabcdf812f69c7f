"""An attempt's inline log (its answer's ``log``) is served by the agent client without a
``GET .../logs``, from any offset, until the attempt is acknowledged; a malformed or
oversized one is ignored and the agent is asked. A real aiohttp agent stand-in on a unix
socket counts the log reads it is asked."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from broker.agent_client import MAX_INLINE_LOG_BYTES, AgentClient, LogChunk

LOG = b"line 1\n\xff not utf-8\n"


class Stub:
    """Answers ``POST /attempts`` with ``log`` (or none), serves ``GET .../logs`` from
    ``served`` and counts those reads."""

    def __init__(self) -> None:
        self.inline: str | None = base64.b64encode(LOG).decode()
        self.served = b"from the agent\n"
        self.log_reads = 0

    async def post(self, request: web.Request) -> web.Response:
        body = await request.json()
        answer = {"attempt_id": body["attempt_id"], "state": "succeeded", "output": 1}
        if self.inline is not None:
            answer["log"] = self.inline
        return web.json_response(answer)

    async def logs(self, request: web.Request) -> web.Response:
        self.log_reads += 1
        offset = int(request.query["offset"])
        data = self.served[offset:]
        return web.json_response(
            {"data": base64.b64encode(data).decode(), "offset": offset + len(data), "done": True}
        )

    async def ack(self, request: web.Request) -> web.Response:
        return web.json_response({"acknowledged": True})


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[tuple[Stub, str]]:
    stub = Stub()
    app = web.Application()
    app.router.add_post("/attempts", stub.post)
    app.router.add_get("/attempts/{id}/logs", stub.logs)
    app.router.add_delete("/attempts/{id}/result", stub.ack)
    runner = web.AppRunner(app)
    await runner.setup()
    path = tmp_path / "agent.sock"
    await web.UnixSite(runner, str(path)).start()
    try:
        yield stub, f"unix:{path}"
    finally:
        await runner.cleanup()


async def test_the_inline_log_is_served_without_asking_the_agent(
    agent: tuple[Stub, str],
) -> None:
    stub, endpoint = agent
    client = AgentClient()
    try:
        status, body = await client.start(endpoint, {"attempt_id": "a:1"}, 5.0)
        assert status == 200 and "log" not in body and body["output"] == 1
        assert await client.logs(endpoint, "a:1", 0) == LogChunk(LOG, len(LOG), True)
        assert await client.logs(endpoint, "a:1", 3) == LogChunk(LOG[3:], len(LOG), True)
        assert await client.logs(endpoint, "a:1", len(LOG)) == LogChunk(b"", len(LOG), True)
        assert stub.log_reads == 0
        await client.ack(endpoint, "a:1")  # forgotten: a later read asks the agent
        assert (await client.logs(endpoint, "a:1", 0)) == LogChunk(stub.served, 15, True)
        assert stub.log_reads == 1
    finally:
        await client.close()


@pytest.mark.parametrize(
    "inline",
    [None, "not base64!", base64.b64encode(b"x" * (MAX_INLINE_LOG_BYTES + 1)).decode()],
)
async def test_without_a_usable_inline_log_the_agent_is_asked(
    agent: tuple[Stub, str], inline: str | None
) -> None:
    stub, endpoint = agent
    stub.inline = inline
    client = AgentClient()
    try:
        status, body = await client.start(endpoint, {"attempt_id": "b:1"}, 5.0)
        assert status == 200 and "log" not in body
        assert await client.logs(endpoint, "b:1", 0) == LogChunk(stub.served, 15, True)
        assert stub.log_reads == 1
    finally:
        await client.close()
