"""A pool's ``network`` on real sandboxed local pods (issue 26): a job in a default (``none``)
pool cannot connect to a TCP listener on the broker host's 127.0.0.1; a job in an
``outbound`` pool reaches a listener outside its namespace (on an address of the host that is
neither in 127.0.0.0/8 nor the one pasta copies into the namespace: 198.18.226.1/32, which the
test adds to the host's ``lo`` for its duration, standing in for any address the host can
reach) and still not the host's 127.0.0.1. Both pools' jobs get their
packages from the broker's loopback URL all the same (through the fetch socket).

Each listener answers a fresh token, so "connected" means it reached the test's listener.
Needs bubblewrap, pasta (``passt``) and root (for the added address); skips with the reason
where any is missing, and fails instead under ``FIREPOOL_REQUIRE_SANDBOX=1`` (CI).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from pod_runtime.network import outbound_status
from tests.conftest import REQUIRE_SANDBOX_ENV, require_sandbox
from tests.require import missing

PROBE = '''
def tcp(request):
    """The first bytes the TCP listener at ``request`` ([host, port]) sends, or why not."""
    import socket

    try:
        with socket.create_connection((request[0], request[1]), timeout=3) as s:
            return "connected " + s.recv(64).decode()
    except OSError as exc:
        return f"refused: {exc}"
'''
OUTSIDE_ADDRESS = "198.18.226.1"  # RFC 2544 benchmarking range: never a real host's address


def require(condition: bool, why: str) -> None:
    """Skip with ``why`` unless ``condition``; fail under ``FIREPOOL_REQUIRE_SANDBOX=1``."""
    if not condition:
        missing(REQUIRE_SANDBOX_ENV, why)


class Listener:
    """A TCP listener that sends ``token`` to every connection, in a thread."""

    def __init__(self, host: str) -> None:
        self.token = uuid.uuid4().hex
        self.sock = socket.create_server((host, 0))
        self.address = (host, self.sock.getsockname()[1])
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(self.token.encode())

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module")
def server() -> Iterator[BrokerServer]:
    require_sandbox()
    home = Path(tempfile.mkdtemp(prefix="firepool-net-", dir="/var/tmp")) / "home"
    catalog = (
        "pools:\n  cpu: {max_count: 1}\n  web: {max_count: 1, network: outbound}\n"
        "  shared: {max_count: 1, network: host}\n"
    )
    server = start_broker(home, catalog)
    try:
        package = home.parent / "probe"
        package.mkdir()
        (package / "probe.py").write_text(PROBE)
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(package, name="closed", sku="cpu", entrypoint="probe:tcp", timeout_s=30)
            fp.deploy(package, name="open", sku="web", entrypoint="probe:tcp", timeout_s=30)
            fp.deploy(package, name="shared", sku="shared", entrypoint="probe:tcp", timeout_s=30)
        yield server
    finally:
        server.stop()
        kill_pods(home)
        shutil.rmtree(home.parent, ignore_errors=True)


@pytest.fixture
def outside() -> Iterator[Listener]:
    """A listener on an address of this host outside 127.0.0.0/8 and other than its primary
    one (which inside an outbound pod's namespace is the namespace's own)."""
    require(os.geteuid() == 0, "adding the outside listener's address needs root")
    require(shutil.which("ip") is not None, "the outside listener needs iproute2 (ip)")
    address = ["ip", "addr", "add", f"{OUTSIDE_ADDRESS}/32", "dev", "lo"]
    subprocess.run(address, check=True)
    try:
        listener = Listener(OUTSIDE_ADDRESS)
        try:
            yield listener
        finally:
            listener.close()
    finally:
        address[2] = "del"
        subprocess.run(address, check=False)


def probe(server: BrokerServer, function: str, address: tuple[str, int]) -> str:
    with server.client("prober") as fp:
        job = fp.invoke(function, list(address))
    assert job["state"] == "SUCCEEDED", job.get("error", job)
    assert isinstance(job["output"], str), job
    return job["output"]


def test_a_job_in_a_default_pool_cannot_reach_the_hosts_loopback(server: BrokerServer) -> None:
    host = Listener("127.0.0.1")
    try:
        with socket.create_connection(host.address, timeout=3) as s:  # it answers the host
            assert s.recv(64).decode() == host.token
        answer = probe(server, "closed", host.address)
        assert answer.startswith("refused"), answer
        assert host.token not in answer and host.accepted == 1
    finally:
        host.close()


def test_a_job_in_a_host_network_pool_reaches_the_hosts_loopback_as_opted_in(
    server: BrokerServer,
) -> None:
    """``network: host`` is the explicit opt-in (a local gang's ranks meet at 127.0.0.1)."""
    host = Listener("127.0.0.1")
    try:
        answer = probe(server, "shared", host.address)
        assert answer == f"connected {host.token}", answer
    finally:
        host.close()


def test_a_job_in_an_outbound_pool_reaches_outside_but_not_the_hosts_loopback(
    server: BrokerServer, outside: Listener
) -> None:
    require(*outbound_status())
    host = Listener("127.0.0.1")
    try:
        assert probe(server, "open", outside.address) == f"connected {outside.token}"
        answer = probe(server, "open", host.address)
        assert answer.startswith("refused"), answer
        assert host.accepted == 0
    finally:
        host.close()
    # a default pool's job reaches neither
    assert probe(server, "closed", outside.address).startswith("refused")
