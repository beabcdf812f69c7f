"""The pieces of network isolation that need no pod: a pool's ``network`` value is checked,
the package fetch socket relays only the store's package URLs (a real HTTP server behind a
real unix socket), and an ``outbound`` pod where pasta is missing fails with a typed error
that says what to install.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp
import pytest

from functions.errors import InvalidRequest, PackageFetchFailed
from pod_runtime import network
from pod_runtime.launch import agent_command
from pod_runtime.package import BlobCache
from pod_runtime.protocol import BlobRef
from pool_manager.backends.package_proxy import PackageFetchProxy, allowed, package_url_prefix
from pool_manager.catalog import PoolSpec
from tests.conftest import require_sandbox

BODY = b"package bytes"
DIGEST = hashlib.sha256(BODY).hexdigest()


@pytest.mark.parametrize("value", [True, False, "Host", "", None, "Outbound"])
def test_a_pool_network_other_than_none_outbound_or_host_is_a_typed_error(value: object) -> None:
    with pytest.raises(InvalidRequest, match="network must be one of none, outbound, host") as err:
        PoolSpec(sku="cpu", network=value)  # type: ignore[arg-type]
    assert err.value.field == "network"
    assert PoolSpec(sku="cpu").network == "none"
    assert PoolSpec(sku="cpu", network="outbound").network == "outbound"
    assert PoolSpec(sku="cpu", network="host").network == "host"


class Upstream:
    """A real HTTP server that serves ``BODY`` at every path and counts the requests."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                upstream.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(BODY)))
                self.end_headers()
                self.wfile.write(BODY)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, digest: str) -> str:
        return f"{self.base}/v1/blobs/{digest}?exp=1&sig=x"


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    server = Upstream()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_only_urls_of_the_stores_form_pass() -> None:
    s3 = package_url_prefix(lambda d: f"https://s3.example:9000/bkt/packages/{d}.zip?X-Amz-S=1")
    blobs = package_url_prefix(lambda d: f"http://127.0.0.1:8080/v1/blobs/{d}?exp=1&sig=2")
    forms = [s3, blobs]
    assert allowed(f"http://127.0.0.1:8080/v1/blobs/{DIGEST}?exp=9&sig=z", forms)
    assert allowed(f"https://s3.example:9000/bkt/packages/{DIGEST}.zip?X-Amz-S=9", forms)
    for url in (
        f"http://127.0.0.1:8081/v1/blobs/{DIGEST}",  # another port
        f"http://127.0.0.1:3306/v1/blobs/{DIGEST}",
        "http://127.0.0.1:8080/v1/jobs",  # another route of the broker
        f"http://127.0.0.1:8080/v1/blobs/../jobs/{DIGEST}",
        f"http://127.0.0.1:8080/v1/blobs/{DIGEST}/x",
        f"http://127.0.0.1:8080/v1/blobs/{DIGEST.upper()}",
        f"http://user:pw@127.0.0.1:8080/v1/blobs/{DIGEST}",
        f"https://s3.example:9000/bkt/packages/{DIGEST}",  # no .zip
        f"https://s3.example:9000/other/packages/{DIGEST}.zip",
        f"file:///v1/blobs/{DIGEST}",
        "not a url",
    ):
        assert allowed(url, forms) is None, url


async def test_the_fetch_socket_relays_package_urls_and_refuses_the_rest(
    upstream: Upstream, tmp_path: Path
) -> None:
    proxy = PackageFetchProxy(tmp_path / ".fetch" / "s", [package_url_prefix(upstream.url)])
    await proxy.start()
    blobs = BlobCache(tmp_path / "blobs", max_bytes=1 << 20, fetch_socket=proxy.path)
    try:
        assert (proxy.path.stat().st_mode & 0o777) == 0o600
        path, cached = await blobs.get(BlobRef(url=upstream.url(DIGEST), digest=DIGEST))
        assert path.read_bytes() == BODY and not cached
        assert upstream.paths == [f"/v1/blobs/{DIGEST}?exp=1&sig=x"]
        other = BlobRef(url=f"{upstream.base}/v1/jobs?{DIGEST}", digest="1" * 64)
        with pytest.raises(PackageFetchFailed, match="HTTP 403: Forbidden"):
            await blobs.get(other, deadline_s=5)
        assert len(upstream.paths) == 1  # refused without being requested
        connector = aiohttp.UnixConnector(path=str(proxy.path))
        async with (  # the socket serves nothing else
            aiohttp.ClientSession(connector=connector) as session,
            session.get("http://x/v1/jobs") as resp,
        ):
            assert resp.status == 404
    finally:
        await blobs.close()
        await proxy.close()
    assert not proxy.path.exists()


async def test_an_unreachable_package_server_is_retried_then_fails_typed(tmp_path: Path) -> None:
    dead = Upstream()
    url = dead.url(DIGEST)
    dead.server.shutdown()
    dead.server.server_close()  # nothing listens at its port now
    proxy = PackageFetchProxy(tmp_path / "s", [package_url_prefix(dead.url)])
    await proxy.start()
    blobs = BlobCache(tmp_path / "blobs", max_bytes=1 << 20, fetch_socket=proxy.path)
    try:
        with pytest.raises(PackageFetchFailed, match=r"failed \d+ times .*HTTP 502"):
            await asyncio.wait_for(blobs.get(BlobRef(url=url, digest=DIGEST), 0.5), 10)
    finally:
        await blobs.close()
        await proxy.close()


def test_an_outbound_pod_without_pasta_is_a_typed_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    require_sandbox()  # probed (and cached) with bwrap on the PATH
    monkeypatch.setenv("PATH", str(tmp_path))  # no pasta on it
    network.outbound_status.cache_clear()
    try:
        with pytest.raises(network.NetworkUnavailable, match="apt-get install passt"):
            agent_command(
                pod_name="p", pod_dir=tmp_path, listen="unix:/x", network="outbound", sandbox=True
            )
    finally:
        network.outbound_status.cache_clear()
