"""``AgentWire``: keep-alive requests to an agent, against a real aiohttp server (what agents
run) and raw asyncio servers for the answers aiohttp never gives (chunked, no length, cut
short, a connection closed while idle)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from broker.agent_wire import AgentWire, WireError

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def aiohttp_agent(tmp_path: Path) -> AsyncIterator[tuple[str, list[object]]]:
    """An aiohttp server on a unix socket that echoes each request; the list holds each
    connection (its protocol object) that carried a request, in order."""
    connections: list[object] = []

    def seen(request: web.Request) -> None:
        if not any(c is request.protocol for c in connections):
            connections.append(request.protocol)

    async def echo(request: web.Request) -> web.Response:
        seen(request)
        body = await request.read()
        answer = b'{"method":"%s","auth":"%s","body":%s}' % (
            request.method.encode(),
            request.headers.get("Authorization", "").encode(),
            body or b"null",
        )
        return web.Response(body=answer, content_type="application/json")

    async def slow(request: web.Request) -> web.Response:
        seen(request)
        await asyncio.sleep(5)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    path = tmp_path / "agent.sock"
    await web.UnixSite(runner, str(path)).start()
    try:
        yield f"unix:{path}", connections
    finally:
        await runner.cleanup()


async def test_requests_reuse_one_connection_and_carry_the_headers(
    aiohttp_agent: tuple[str, list[object]],
) -> None:
    endpoint, connections = aiohttp_agent
    wire = AgentWire(endpoint, {"Authorization": "Bearer s3cret"})
    try:
        for n in range(5):
            status, body = await wire.request("POST", "/echo", b'{"n":%d}' % n, 5.0)
            assert status == 200
            assert body == b'{"method":"POST","auth":"Bearer s3cret","body":{"n":%d}}' % n
        status, body = await wire.request("DELETE", "/echo", None, 5.0)
        assert status == 200 and b'"body":null' in body
        assert (await wire.request("GET", "/nope", None, 5.0))[0] == 404
        assert len(connections) == 1
    finally:
        wire.close()


async def test_a_timed_out_request_closes_its_connection(
    aiohttp_agent: tuple[str, list[object]],
) -> None:
    endpoint, connections = aiohttp_agent
    wire = AgentWire(endpoint, {})
    try:
        with pytest.raises(TimeoutError):
            await wire.request("GET", "/slow", None, 0.2)
        assert (await wire.request("GET", "/echo", None, 5.0))[0] == 200
        assert len(connections) == 2  # the timed-out one was not reused
    finally:
        wire.close()


async def test_a_request_in_flight_when_the_wire_closes_keeps_no_connection(
    raw_agent: tuple[str, list[Handler]],
) -> None:
    """A pod forgotten mid-request (deleted, the broker stopping): the answer still comes, and
    its connection is closed, not kept where nothing would ever close it."""
    endpoint, handlers = raw_agent
    answered = asyncio.Event()

    async def slow_keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await answered.wait()
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        await reader.read()  # until the broker side closes

    handlers.append(slow_keep_alive)
    wire = AgentWire(endpoint, {})
    request = asyncio.create_task(wire.request("GET", "/x", None, 5.0))
    await asyncio.sleep(0.1)
    wire.close()
    answered.set()
    assert await request == (200, b"{}")
    assert wire._idle == []


@pytest.fixture
async def raw_agent(tmp_path: Path) -> AsyncIterator[tuple[str, list[Handler]]]:
    """A unix server whose n-th connection is handled by the n-th handler appended."""
    handlers: list[Handler] = []
    path = tmp_path / "raw.sock"

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await handlers.pop(0)(reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_unix_server(serve, str(path))
    try:
        yield f"unix:{path}", handlers
    finally:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


def _replying(answer: bytes) -> Handler:
    """A handler that reads one request and writes ``answer``, raw, as the agent's reply."""

    async def reply(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        w.write(answer)
        await w.drain()

    return reply


async def test_a_connection_closed_while_idle_is_replaced_once(
    raw_agent: tuple[str, list[Handler]],
) -> None:
    endpoint, handlers = raw_agent
    served: list[bytes] = []

    async def answer_then_close(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        served.append(await _read_request(reader))
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await w.drain()
        await _read_request(reader)  # the next request arrives, unanswered: closed

    async def answer(reader: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        served.append(await _read_request(reader))
        w.write(b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nagain")
        await w.drain()

    handlers += [answer_then_close, answer]
    wire = AgentWire(endpoint, {})
    try:
        assert await wire.request("POST", "/a", b"1", 5.0) == (200, b"ok")
        assert await wire.request("POST", "/a", b"2", 5.0) == (201, b"again")
        assert served == [b"1", b"2"]
    finally:
        wire.close()


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
         (200, b"abcde")),
        (b"HTTP/1.0 500 Oops\r\nContent-Type: text/plain\r\n\r\nno length", (500, b"no length")),
    ],
)  # fmt: skip
async def test_chunked_and_unsized_answers_are_read_whole(
    raw_agent: tuple[str, list[Handler]], answer: bytes, expected: tuple[int, bytes]
) -> None:
    endpoint, handlers = raw_agent
    handlers.append(_replying(answer))
    wire = AgentWire(endpoint, {})
    try:
        assert await wire.request("GET", "/x", None, 5.0) == expected
    finally:
        wire.close()


@pytest.mark.parametrize(
    "answer",
    [
        b"",  # closed without answering (a new connection: not retried)
        b"SSH-2.0-OpenSSH\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\nContent-Length: 999999999999\r\n\r\n",
    ],
)
async def test_a_broken_answer_is_a_wire_error(
    raw_agent: tuple[str, list[Handler]], answer: bytes
) -> None:
    endpoint, handlers = raw_agent
    handlers.append(_replying(answer))
    wire = AgentWire(endpoint, {})
    try:
        with pytest.raises(WireError):
            await wire.request("GET", "/x", None, 5.0)
    finally:
        wire.close()


def test_unknown_endpoints_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown agent endpoint"):
        AgentWire("http://pod", {})
