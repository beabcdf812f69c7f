"""HTTP/1.1 to one pod agent over keep-alive connections: what ``AgentClient`` sends on.

The agent protocol (docs/architecture.md §1) is small JSON requests and answers, one or two
per attempt, so a general client's per-request machinery (aiohttp's: about a third of the
broker's CPU on a warm call) buys nothing here. ``AgentWire`` writes a request in one send
and reads the answer by its ``Content-Length`` (or chunked, or to the connection's end),
over connections kept open between requests: an idle one is reused, a busy one never shared
(a long poll and a cancel to the same agent each take their own), and at most
``MAX_IDLE`` idle ones are kept.

A request whose reused connection turns out closed before any byte of an answer came (the
agent closed it while idle, or restarted) is sent once more on a new connection; every
agent route may be: an attempt is started once per id, a second reset or acknowledgement
changes nothing. Every other failure, and an answer larger than ``MAX_ANSWER_BYTES``,
raises ``WireError`` (an ``OSError``); a request cancelled or timed out mid-exchange
closes its connection. Event-loop only.
"""

from __future__ import annotations

import asyncio

MAX_IDLE = 4
"""Idle connections kept per agent (a pod runs one attempt at a time: one or two suffice)."""
MAX_ANSWER_BYTES = 256 * 1024 * 1024
"""The largest answer read (an attempt's output is at most 16 MiB, a log chunk 1 MiB)."""
MAX_HEADER_LINES = 100


class WireError(OSError):
    """The agent's answer could not be read: malformed, too large or cut short."""


class _Closed(Exception):
    """A reused connection was closed before any byte of the answer arrived."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def usable(self) -> bool:
        return not self.writer.is_closing() and not self.reader.at_eof()

    def close(self) -> None:
        self.writer.close()


class AgentWire:
    """Requests to one agent endpoint (``unix:PATH`` or ``tcp:HOST:PORT[#pod]``), each
    carrying ``headers`` (the pod's secret)."""

    def __init__(self, endpoint: str, headers: dict[str, str]) -> None:
        if endpoint.startswith("unix:"):
            self._path: str | None = endpoint[5:]
            self._host, self._port, host = "", 0, "pod"
        elif endpoint.startswith("tcp:"):
            self._path = None
            address = endpoint[4:].partition("#")[0]
            self._host, _, port = address.rpartition(":")
            self._port, host = int(port), address
        else:
            raise ValueError(f"unknown agent endpoint {endpoint!r}")
        fixed = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = f"Host: {host}\r\n{fixed}".encode("latin-1")
        self._idle: list[_Conn] = []
        self._closed = False
        """Set by ``close``: a request still in flight then closes its connection after the
        answer instead of keeping it (nothing would ever close a kept one)."""

    async def _open(self) -> _Conn:
        if self._path is not None:
            reader, writer = await asyncio.open_unix_connection(self._path)
        else:
            reader, writer = await asyncio.open_connection(self._host, self._port)
        return _Conn(reader, writer)

    async def request(
        self, method: str, target: str, body: bytes | None, timeout: float
    ) -> tuple[int, bytes]:
        """``(status, answer body)`` of one request, within ``timeout`` seconds."""
        head = f"{method} {target} HTTP/1.1\r\n".encode("latin-1") + self._head
        if body is not None:
            head += b"Content-Type: application/json\r\n"
        head += b"Content-Length: %d\r\n\r\n" % len(body or b"")
        data = head + (body or b"")
        async with asyncio.timeout(timeout):
            while self._idle:
                conn = self._idle.pop()
                if not conn.usable():
                    conn.close()
                    continue
                try:
                    return await self._exchange(conn, data, reused=True)
                except _Closed:
                    continue  # closed while idle: a new connection
            return await self._exchange(await self._open(), data, reused=False)

    async def _exchange(self, conn: _Conn, data: bytes, reused: bool) -> tuple[int, bytes]:
        kept = False
        try:
            conn.writer.write(data)
            await conn.writer.drain()
            try:
                status_line = await conn.reader.readline()
            except ConnectionError:
                if reused:
                    raise _Closed() from None
                raise
            if not status_line:
                if reused:
                    raise _Closed()
                raise WireError("the agent closed the connection without answering")
            status, keep, answer = await _read_answer(conn.reader, status_line)
            if keep and not self._closed and len(self._idle) < MAX_IDLE:
                self._idle.append(conn)
                kept = True
            return status, answer
        except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
            raise WireError(f"malformed answer: {exc!r}") from exc
        finally:
            if not kept:
                conn.close()

    def close(self) -> None:
        self._closed = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()


async def _read_answer(reader: asyncio.StreamReader, status_line: bytes) -> tuple[int, bool, bytes]:
    """``(status, keep the connection, body)`` of an answer whose status line was read."""
    version, _, rest = status_line.partition(b" ")
    if not version.startswith(b"HTTP/1."):
        raise WireError(f"not an HTTP answer: {status_line[:80]!r}")
    status = int(rest[:3])
    keep = version == b"HTTP/1.1"
    length: int | None = None
    chunked = False
    for _ in range(MAX_HEADER_LINES):
        line = await reader.readline()
        if line in (b"\r\n", b"\n"):
            break
        if not line:
            raise WireError("the answer's headers were cut short")
        name, _, value = line.partition(b":")
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = b"chunked" in value
        elif name == b"connection":
            keep = value == b"keep-alive" or (keep and value != b"close")
    else:
        raise WireError("too many header lines")
    if chunked:
        return status, keep, await _read_chunked(reader)
    if length is not None:
        if length > MAX_ANSWER_BYTES:
            raise WireError(f"an answer of {length} bytes is over {MAX_ANSWER_BYTES}")
        return status, keep, await reader.readexactly(length)
    if status in (204, 304) or 100 <= status < 200:
        return status, keep, b""
    body = b""  # no length: the answer runs to the connection's end
    while chunk := await reader.read(1 << 16):
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise WireError(f"an answer over {MAX_ANSWER_BYTES} bytes")
    return status, False, body


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        line = await reader.readline()
        n = int(line.split(b";", 1)[0].strip(), 16)
        if n == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        size += n
        if size > MAX_ANSWER_BYTES:
            raise WireError(f"an answer over {MAX_ANSWER_BYTES} bytes")
        parts.append(await reader.readexactly(n))
        await reader.readexactly(2)  # the chunk's CRLF
