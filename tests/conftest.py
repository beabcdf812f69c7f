"""Shared fixtures: a real broker process on loopback with its own state directory
(real HTTP, real SQLite, real pod agent processes). See ``gateway.harness``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "functions"

__all__ = ["BrokerServer", "deploy_examples"]


def deploy_examples(server: BrokerServer, names: dict[str, str]) -> None:
    with server.client("deployer", Role.DEPLOY) as fp:
        for name, entrypoint in names.items():
            fp.deploy(EXAMPLES / name, name=name, sku="cpu", entrypoint=entrypoint, timeout_s=30)


@pytest.fixture(scope="module")
def broker_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    home = tmp_path_factory.mktemp("firepool")
    catalog = (
        "budgets: {cpu: 16}\n"
        "pools:\n"
        "  cpu: {min_count: 1, max_idle_count: 2, max_count: 8, idle_timeout_s: 120}\n"
    )
    server = start_broker(home, catalog)
    try:
        deploy_examples(server, {"noop": "noop:noop"})
        yield server
    finally:
        server.stop()
        kill_pods(home)
