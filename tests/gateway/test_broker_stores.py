"""The broker end to end on every job store: the embedded SQLite and MySQL/MariaDB."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from tests.conftest import BEHAVIOURS, EXAMPLES, scratch_database, wait_running
from tests.helpers import wait_at_agent

CATALOG = "pools:\n  cpu: {min_count: 1, max_count: 4}\n"


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
def store_env(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {}
        return
    server_url = request.getfixturevalue("mysql_server_url")
    with scratch_database(server_url) as url:
        yield {"FIREPOOL_STORE_URL": url}


def test_invoke_reuse_and_crash_recovery_on_every_store(
    tmp_path: Path, store_env: dict[str, str]
) -> None:
    home = tmp_path / "home"
    server: BrokerServer = start_broker(home, CATALOG, extra_env=store_env)
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop")
            fp.deploy(BEHAVIOURS, name="sleep", sku="cpu", entrypoint="behaviours:sleep")
        with server.client("store-user") as fp:
            first = fp.invoke("noop", {"a": 1}, lease_tag="t")
            second = fp.invoke("noop", {"a": 2}, lease_tag="t")
            assert second["acquisition"]["path"] == "warm"
            assert second["output"] == {"a": 2}
            running = fp.submit("sleep", 1.5)
            wait_at_agent(home, wait_running(fp, running))  # a kill before re-queues it
        port = int(server.url.rsplit(":", 1)[1])
        server.kill()
        server = start_broker(home, CATALOG, port=port, extra_env=store_env)
        with server.client("store-user") as fp:
            done = fp.wait(running, timeout_s=60)
            assert done["state"] == "SUCCEEDED" and len(done["attempts"]) == 1
            assert fp.job(first["id"])["output"] == {"a": 1}
    finally:
        server.stop()
        kill_pods(home)
