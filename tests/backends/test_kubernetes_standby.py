"""Standby promotion on a cluster, end to end: a ``firepool serve`` process on the kubernetes
backend over kmock's emulated API server and the node emulator with one emulated card
(``k8s_node_emulator`` says what the emulated card and driver are, and are not).

Held here (paper §6, A.4): the standby the broker stages asks for the configured fractional
share pinned to its active pod's card by UUID (the card its active's agent reported); a job
that can only be served by promoting it waits while the card's report is missing (fail
closed), and is served by the promoted standby once the report is clean; a job on the card
sees it pinned with the whole card's memory as its limit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.auth import Role
from gateway.harness import BrokerServer, free_port, start_broker
from tests.backends.k8s_node_emulator import CARD_MIB, NAMESPACE, EmulatedCluster, emulated_cluster
from tests.conftest import BEHAVIOURS

CATALOG = """\
budgets: {h200: 1}
pools:
  h200:
    accelerator: h200
    min_count: 0
    max_count: 1
    idle_timeout_s: 300
    standbys_per_active: 1
    template:
      image: firepool-pod:test
      resources: {limits: {nvidia.com/gpumem: 130000}}
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedCluster]:
    with emulated_cluster(tmp_path / "nodes", gpus_per_node=1) as emulated:
        yield emulated


@pytest.fixture
def server(cluster: EmulatedCluster, tmp_path: Path) -> Iterator[BrokerServer]:
    env = {
        "FIREPOOL_BACKEND": "kubernetes",
        "FIREPOOL_K8S_KUBECONFIG": str(cluster.kubeconfig(tmp_path / "kubeconfig")),
        "FIREPOOL_K8S_NAMESPACE": NAMESPACE,
        "FIREPOOL_K8S_AGENT_PORT": str(free_port()),
        "FIREPOOL_K8S_STANDBY_GPU_MEMORY_MIB": "512",
        "FIREPOOL_K8S_STANDBY_GPU_CORES": "5",
        "FIREPOOL_GPU_SWEEP_S": "0.2",
    }
    broker = start_broker(tmp_path / "home", CATALOG, extra_env=env)
    try:
        with broker.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="gpu-env", sku="h200", entrypoint="behaviours:gpu_env",
                      timeout_s=30)  # fmt: skip
        yield broker
    finally:
        broker.stop()


def _pods(server: BrokerServer) -> list[dict[str, Any]]:
    with server.client("ops", Role.ADMIN) as fp:
        return list(fp._http.get("/v1/pools?pods=1").json()["pod_list"])


def _until(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)
    return got


def test_promotion_waits_while_the_cards_report_is_missing_and_goes_ahead_once_clean(
    cluster: EmulatedCluster, server: BrokerServer
) -> None:
    node = cluster.node
    assert node is not None
    (card,) = node.cards
    node.set_card(card, readable=False)  # the card's processes cannot be read: no report
    with server.client("gpu-alice") as fp:
        first = fp.invoke("gpu-env", None, lease_tag="a")  # held for alice afterwards
    assert first["state"] == "SUCCEEDED", first
    assert first["output"]["CUDA_VISIBLE_DEVICES"] == card  # its agent found its card
    assert first["output"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{CARD_MIB}m"  # the whole card

    standby = _until(lambda: next((p for p in _pods(server) if p["role"] == "standby"
                                   and p["state"] == "IDLE"), None))  # fmt: skip
    assert standby["gpu"] == card
    stored = cluster.objects("pods")[standby["name"]]
    assert stored["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == card
    assert stored["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": 1, "nvidia.com/gpumem": 512, "nvidia.com/gpucores": 5}  # fmt: skip

    with server.client("gpu-bob") as fp:
        job_id = fp.submit("gpu-env", None, lease_tag="b")
        time.sleep(3.0)  # fifteen sweeps, every one finding the report missing
        assert fp.job(job_id)["state"] == "QUEUED", "promoted on a card nobody could read"
        node.set_card(card, readable=True)  # a clean report: nothing computes on the card
        second = fp.wait(job_id, timeout_s=30)
    assert second["state"] == "SUCCEEDED", second
    assert second["acquisition"]["path"] == "standby", second["acquisition"]
    assert second["attempts"][-1]["pods"] == [standby["name"]]
    assert second["output"]["CUDA_VISIBLE_DEVICES"] == card
