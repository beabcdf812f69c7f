"""Gangs on the kubernetes backend, end to end through kmock's emulated API server and the
node emulator with two nodes (``k8s_node_emulator``): a ``firepool serve`` process places a
2-pod gang's ranks on pods of both nodes, each pod at an address of its node's range.

Held here: the ranks reach each other at the addresses they were given (rank 0 listens at
``MASTER_ADDR:MASTER_PORT``, its pod IP and the pod's declared rendezvous port, and rank 1
connects there); a broker SIGKILLed during a gang job re-attaches every rank (the job runs
once and each rank's result is collected); a rank killed while the broker is down fails the
job with that rank's error, rank 0 stopped.

What the emulation cannot show: its "nodes" are address ranges of one host's loopback, so
nothing but the address separates them (no routing between real machines, no firewall).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.keys import load_or_create_key
from gateway.auth import Role
from gateway.harness import BrokerServer, free_port, start_broker
from pod_runtime.agent_auth import agent_key, bearer, pod_secret
from tests.backends.k8s_node_emulator import NAMESPACE, EmulatedCluster, emulated_cluster
from tests.conftest import BEHAVIOURS

CATALOG = """\
budgets: {cpu: 10}
pools:
  cpu:
    min_count: 0
    max_idle_count: 4
    max_count: 10
    idle_timeout_s: 300
    template:
      image: firepool-pod:test
      resources: {requests: {cpu: 100m, memory: 128Mi}}
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmulatedCluster]:
    with emulated_cluster(tmp_path / "nodes", nodes=2) as emulated:
        yield emulated


def _env(cluster: EmulatedCluster, root: Path) -> dict[str, str]:
    return {
        "FIREPOOL_BACKEND": "kubernetes",
        "FIREPOOL_K8S_KUBECONFIG": str(cluster.kubeconfig(root / "kubeconfig")),
        "FIREPOOL_K8S_NAMESPACE": NAMESPACE,
        "FIREPOOL_K8S_AGENT_PORT": str(free_port()),
        "FIREPOOL_K8S_RENDEZVOUS_PORT": str(free_port()),
    }


@pytest.fixture
def servers(cluster: EmulatedCluster, tmp_path: Path) -> Iterator[list[BrokerServer]]:
    """A broker on the two-node cluster (the list holds the current process: a test may kill
    and replace it), the gang functions deployed."""
    env = _env(cluster, tmp_path)
    holder = [start_broker(tmp_path / "home", CATALOG, extra_env=env)]
    try:
        with holder[0].client("deployer", Role.DEPLOY) as fp:
            for name in ("rendezvous", "gang_pids"):
                fp.deploy(BEHAVIOURS, name=name, sku="cpu", entrypoint=f"behaviours:{name}",
                          pods=2, timeout_s=60, max_retries=0)  # fmt: skip
        yield holder
    finally:
        holder[0].stop()


def _restart(servers: list[BrokerServer], cluster: EmulatedCluster, tmp_path: Path) -> None:
    """SIGKILL the broker (nothing flushed, no pod touched) and start it again on the same
    home and port."""
    old = servers[0]
    old.kill()
    env = _env(cluster, tmp_path)  # the same ports as the pods declare
    env["FIREPOOL_K8S_AGENT_PORT"] = _agent_port(cluster)
    env["FIREPOOL_K8S_RENDEZVOUS_PORT"] = _rendezvous_port(cluster)
    servers[0] = start_broker(old.home, CATALOG, port=int(old.url.rsplit(":", 1)[1]), extra_env=env)


def _ports(cluster: EmulatedCluster) -> dict[str, int]:
    pod = next(iter(cluster.objects("pods").values()))
    return {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}


def _agent_port(cluster: EmulatedCluster) -> str:
    return str(_ports(cluster)["agent"])


def _rendezvous_port(cluster: EmulatedCluster) -> str:
    return str(_ports(cluster)["rendezvous"])


def _agent(
    server: BrokerServer, cluster: EmulatedCluster, pod: str, path: str, method: str = "GET"
) -> Any:
    """``method`` ``path`` of pod ``pod``'s agent, with its secret: the answer's JSON, None
    for a 404."""
    ip = cluster.objects("pods")[pod]["status"]["podIP"]
    key = agent_key(load_or_create_key(server.home / "signing.key"))
    url = f"http://{ip}:{_agent_port(cluster)}{path}"
    answer = httpx.request(method, url, headers=bearer(pod_secret(key, pod)), timeout=10)
    return None if answer.status_code == 404 else answer.json()


def _wait_for(check: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _runs(directory: Path, rank: int) -> list[int]:
    path = directory / f"rank-{rank}.runs"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_two_pod_gang_on_two_nodes_meets_at_rank_zeros_pod_address(
    servers: list[BrokerServer], cluster: EmulatedCluster
) -> None:
    with servers[0].client("gang-user") as fp:
        job = fp.invoke("rendezvous", 20)
    assert job["state"] == "SUCCEEDED", job["error"]
    rank0, rank1 = job["attempts"][0]["pods"]
    pods = cluster.objects("pods")
    assert cluster.node is not None
    assert cluster.node.placed[rank0] != cluster.node.placed[rank1], "one rank per node"
    assert pods[rank0]["spec"]["nodeName"] != pods[rank1]["spec"]["nodeName"]
    ip0, ip1 = (pods[p]["status"]["podIP"] for p in (rank0, rank1))
    assert ip0.rsplit(".", 1)[0] != ip1.rsplit(".", 1)[0], "each node its own address range"
    assert pods[rank0]["status"]["hostIP"] != pods[rank1]["status"]["hostIP"]
    out = job["output"]
    assert out["MASTER_ADDR"] == ip0, "rank 0's pod address, not loopback"
    assert out["MASTER_PORT"] == _rendezvous_port(cluster), "the port declared on the pod"
    assert (out["RANK"], out["NODE_RANK"], out["WORLD_SIZE"]) == ("0", "0", "2")
    assert (out["LOCAL_RANK"], out["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert out["heard"] == "hello from rank 1", "rank 1 reached rank 0 at MASTER_ADDR"


def test_a_broker_killed_during_a_gang_job_re_attaches_every_rank(
    servers: list[BrokerServer], cluster: EmulatedCluster, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with servers[0].client("gang-crash") as fp:
        job_id = fp.submit("gang_pids", {"dir": str(runs), "seconds": 3})
    _wait_for(lambda: _runs(runs, 0) and _runs(runs, 1), "both ranks to start")
    _restart(servers, cluster, tmp_path)
    with servers[0].client("gang-crash") as fp:
        job = fp.wait(job_id, timeout_s=60)
    assert job["state"] == "SUCCEEDED", job["error"]
    assert job["output"]["rank"] == "0"
    assert len(job["attempts"]) == 1
    assert (len(_runs(runs, 0)), len(_runs(runs, 1))) == (1, 1), "every rank ran once"
    attempt = job["attempts"][0]["id"]
    for pod in job["attempts"][0]["pods"]:  # every rank's result taken and acknowledged
        _wait_for(
            lambda pod=pod: attempt not in _agent(servers[0], cluster, pod, "/healthz")["attempts"],
            f"{pod}'s result to be collected",
        )


def test_a_rank_killed_while_the_broker_is_down_fails_the_gang_with_its_error(
    servers: list[BrokerServer], cluster: EmulatedCluster, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    with servers[0].client("gang-victim") as fp:
        job_id = fp.submit("gang_pids", {"dir": str(runs), "seconds": 60})
        _wait_for(lambda: _runs(runs, 0) and _runs(runs, 1), "both ranks to start")
        running = fp.job(job_id)
    servers[0].kill()
    [pid0], [pid1] = _runs(runs, 0), _runs(runs, 1)
    os.kill(pid1, signal.SIGKILL)
    attempt = running["attempts"][-1]["id"]
    rank0, rank1 = running["attempts"][-1]["pods"]
    path = f"/attempts/{attempt}?wait=0"
    _wait_for(lambda: _agent(servers[0], cluster, rank1, path)["state"] == "failed", "rank 1")
    rank1_error = _agent(servers[0], cluster, rank1, path)["error"]
    assert _agent(servers[0], cluster, rank0, path)["state"] == "running"
    _restart(servers, cluster, tmp_path)
    with servers[0].client("gang-victim") as fp:
        job = fp.wait(job_id, timeout_s=60)
    assert job["state"] == "FAILED"
    assert job["error"]["class"] == rank1_error["class"]
    assert job["error"]["message"] == rank1_error["message"]
    assert "SIGKILL" in job["error"]["message"]
    assert len(job["attempts"]) == 1 and len(_runs(runs, 0)) == 1, "not run again"
    _wait_for(lambda: not _alive(pid0), "rank 0 to be stopped")
    for pod in (rank0, rank1):
        _wait_for(
            lambda pod=pod: attempt not in _agent(servers[0], cluster, pod, "/healthz")["attempts"],
            f"{pod}'s result to be collected",
        )


def test_a_gang_launched_on_some_ranks_only_is_cancelled_there_and_run_again(
    servers: list[BrokerServer], cluster: EmulatedCluster, tmp_path: Path
) -> None:
    """The broker died between rank launches: rank 0 waits at the rendezvous for a rank 1
    that never comes. Made here by taking the attempt off rank 1's agent (cancelled and
    acknowledged) while the broker is down."""
    runs = tmp_path / "runs"
    runs.mkdir()
    with servers[0].client("gang-half") as fp:
        job_id = fp.submit("gang_pids", {"dir": str(runs), "seconds": 60})
        _wait_for(lambda: _runs(runs, 0) and _runs(runs, 1), "both ranks to start")
        running = fp.job(job_id)
    servers[0].kill()
    attempt = running["attempts"][-1]["id"]
    rank1 = running["attempts"][-1]["pods"][1]
    path = f"/attempts/{attempt}"
    _agent(servers[0], cluster, rank1, path, "DELETE")
    _wait_for(lambda: _agent(servers[0], cluster, rank1, path)["state"] != "running", "cancel")
    _agent(servers[0], cluster, rank1, f"{path}/result", "DELETE")
    assert _agent(servers[0], cluster, rank1, path) is None, "rank 1 never launched"
    [pid0] = _runs(runs, 0)
    _restart(servers, cluster, tmp_path)
    _wait_for(lambda: not _alive(pid0), "the launched rank 0 to be cancelled")
    with servers[0].client("gang-half") as fp:
        _wait_for(lambda: len(_runs(runs, 0)) == 2 and len(_runs(runs, 1)) == 2, "a new run")
        job = fp.job(job_id)
    assert job["state"] == "RUNNING"
    assert [a["error"]["class"] for a in job["attempts"][:-1]] == ["PodLost"]
    assert job["attempts"][-1]["id"] != attempt
