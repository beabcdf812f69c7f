"""GPU pools on the local backend, with declared cards (no GPU or NVML exists here).

What this proves without a GPU: active pods are pinned to distinct cards, standbys are staged
on their active's card and count once in the budget, a job's environment names its card, and
standby promotion stays off (fail closed) because the exclusivity sweep cannot read NVML. The
real card behaviour (VRAM, handover time) needs the GPU machine (issue 5's device check).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from tests.conftest import BEHAVIOURS

CATALOG = (
    "gpus: {h200: [GPU-fake-0, GPU-fake-1]}\n"
    "budgets: {h200: 2, cpu: 4}\n"
    "pools:\n"
    "  cpu: {min_count: 0}\n"
    "  h200: {accelerator: h200, min_count: 0, max_count: 2, standbys_per_active: 1}\n"
)


@pytest.fixture(scope="module")
def gpu_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    home = tmp_path_factory.mktemp("gpu")
    server = start_broker(home, CATALOG)
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="gpu-env", sku="h200", entrypoint="behaviours:gpu_env")
        yield server
    finally:
        server.stop()
        kill_pods(home)


def _pods(server: BrokerServer) -> list[dict]:
    with server.client("ops", Role.ADMIN) as fp:
        return list(fp._http.get("/v1/pools?pods=1").json()["pod_list"])


def test_actives_get_distinct_cards_and_jobs_see_only_theirs(gpu_broker: BrokerServer) -> None:
    jobs = {}
    for caller in ("gpu-a", "gpu-b"):
        with gpu_broker.client(caller) as fp:
            jobs[caller] = fp.invoke("gpu-env", None, lease_tag="t")
    cards = {c: j["output"]["CUDA_VISIBLE_DEVICES"] for c, j in jobs.items()}
    assert set(cards.values()) == {"GPU-fake-0", "GPU-fake-1"}
    pods = {p["name"]: p for p in _pods(gpu_broker)}
    for job in jobs.values():
        pod = pods[job["attempts"][0]["pods"][0]]
        assert pod["gpu"] == job["output"]["CUDA_VISIBLE_DEVICES"]
        assert pod["role"] == "active"


def test_standbys_share_their_actives_card_count_once_and_are_not_promoted_unverified(
    gpu_broker: BrokerServer,
) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pods = [p for p in _pods(gpu_broker) if p["sku"] == "h200"]
        standbys = [p for p in pods if p["role"] == "standby" and p["state"] == "IDLE"]
        if len(standbys) >= 2:
            break
        time.sleep(0.2)
    actives = {p["gpu"] for p in pods if p["role"] == "active"}
    assert {p["gpu"] for p in standbys} <= actives, "a standby sits on its active's card"
    with gpu_broker.client("ops", Role.ADMIN) as fp:
        budget = fp.pools()["budgets"]["h200"]
    assert budget["used"] <= budget["budget"] == 2, "each card's group counts once"
    # A new caller finds both cards held by their owners: no standby may be promoted on a
    # card the sweep never verified, so the job must wait (here: until we give up).
    with gpu_broker.client("gpu-c") as fp:
        job_id = fp.submit("gpu-env", None)
        time.sleep(2.0)
        job = fp.job(job_id)
        assert job["state"] == "QUEUED", job.get("acquisition")
        fp.cancel(job_id)
