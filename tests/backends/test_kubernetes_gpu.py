"""GPU standby on a cluster, through kmock's emulated API server and the node emulator's
emulated GPUs (``k8s_node_emulator``: what its cards are and are not is written there).

Held here (paper §6, A.4): an active GPU pod's card comes back from its own agent (NVML in the
pod) or from the scheduler's annotation, and is written on the pod for a restarted broker; a
standby asks for the configured fractional share pinned to that card's UUID; the exclusivity
sweep reads each card from the agents of the pods pinned to it and fails closed: a card whose
report is missing, or that lists a process of no group pod's job, is not exclusive, and a
card whose agents all fail to answer gets no verdict (nothing changes).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from pod_runtime.agent_auth import agent_key
from pool_manager.backends.gpu_share import GpuShare
from pool_manager.backends.kubernetes import KubernetesBackend
from pool_manager.backends.kubernetes_api import KubeApi, connect
from pool_manager.backends.kubernetes_spec import ANNOTATION_GPU, pod_card
from pool_manager.backends.local import free_tcp_port
from pool_manager.catalog import Catalog, PoolSpec
from tests.backends.k8s_node_emulator import NAMESPACE, EmulatedCluster, emulated_cluster

KEY = agent_key(b"gpu-standby".ljust(32))
POOL: PoolSpec = Catalog.from_mapping({"pools": {"h200": {
    "accelerator": "h200", "standbys_per_active": 1,
    "template": {"image": "firepool-pod:test",
                 "resources": {"limits": {"nvidia.com/gpumem": 130000}}},
}}}).pools["h200"]  # fmt: skip


async def _backend(
    cluster: EmulatedCluster, tmp_path: Path, made: list[KubernetesBackend]
) -> KubernetesBackend:
    api = KubeApi(connect(cluster.kubeconfig(tmp_path / "kubeconfig")), NAMESPACE)
    backend = KubernetesBackend(api, KEY, agent_port=free_tcp_port("127.0.0.1"),
                                ip_timeout_s=30, card_timeout_s=30)  # fmt: skip
    made.append(backend)
    return backend


@pytest.fixture(params=[False, True], ids=["card-from-agent", "card-from-scheduler"])
async def gpu_cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[EmulatedCluster, KubernetesBackend]]:
    made: list[KubernetesBackend] = []
    with emulated_cluster(tmp_path / "nodes", gpus_per_node=2,
                          scheduler_annotations=request.param) as cluster:  # fmt: skip
        backend = await _backend(cluster, tmp_path, made)
        try:
            yield cluster, backend
        finally:
            for pod in await backend.list():
                await backend.delete(pod.name)
            for b in made:
                await b.close()


async def _until(check: Callable[[], object], timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_standby_requests_its_share_pinned_to_its_active_pods_card_by_uuid(
    gpu_cluster: tuple[EmulatedCluster, KubernetesBackend], tmp_path: Path
) -> None:
    cluster, backend = gpu_cluster
    node = cluster.node
    assert node is not None
    active = await backend.create("h200-a", POOL)
    assert active.gpu is not None and active.gpu == node.allocated["h200-a"]
    standby = await backend.create("h200-s", POOL, role="standby", gpu=active.gpu)
    assert standby.gpu == active.gpu and node.allocated["h200-s"] == active.gpu
    stored = cluster.objects("pods")
    spec = stored["h200-s"]["spec"]["containers"][0]
    assert spec["resources"]["limits"] == {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 256,
                                           "nvidia.com/gpucores": 1}  # fmt: skip
    assert stored["h200-s"]["metadata"]["annotations"]["nvidia.com/use-gpuuuid"] == active.gpu
    # The active's card is on the pod itself (the scheduler's annotation, else the one the
    # backend wrote from the agent's report): a restarted broker's backend lists it.
    await _until(lambda: stored_gpu(cluster, "h200-a") == active.gpu)
    again = await _backend(cluster, tmp_path, [])
    try:
        listed = {p.name: p.gpu for p in await again.list()}
    finally:
        await again.close()
    assert listed == {"h200-a": active.gpu, "h200-s": active.gpu}


def stored_gpu(cluster: EmulatedCluster, name: str) -> str | None:
    pod = cluster.objects("pods")[name]
    if cluster.scheduler_annotations:
        assert ANNOTATION_GPU not in pod["metadata"]["annotations"]  # nothing to add
    return pod_card(pod)


async def test_the_sweep_fails_closed_until_the_cards_report_is_clean(
    gpu_cluster: tuple[EmulatedCluster, KubernetesBackend],
) -> None:
    cluster, backend = gpu_cluster
    node = cluster.node
    assert node is not None
    active = await backend.create("h200-a", POOL)
    card = active.gpu
    assert card is not None
    await backend.create("h200-s", POOL, role="standby", gpu=card)
    await _until(lambda: {"h200-a", "h200-s"} <= set(node.pods))

    async def verdict() -> bool | None:
        return (await backend.sweep([card])).get(card)

    node.set_card(card, readable=False)  # the card's report is missing
    await _until(lambda: ip_known(backend, "h200-a") and ip_known(backend, "h200-s"))
    assert await _eventually_answered(verdict) is False
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        node.set_card(card, readable=True, processes=[stranger.pid])  # not a group pod's job
        assert await verdict() is False
        node.set_card(card, processes=[])
        assert await verdict() is True  # clean: promotion may go ahead
        # A process of a group pod's own (below its agent, as a job is) keeps it clean.
        await _until(lambda: _zygote_of(node.pods["h200-a"]) is not None)
        job = _zygote_of(node.pods["h200-a"])
        assert job is not None
        node.set_card(card, processes=[job])
        assert await verdict() is True
    finally:
        stranger.kill()
        stranger.wait()
    # Agents that cannot be reached give no verdict: the broker changes nothing.
    for name in ("h200-a", "h200-s"):
        os.kill(node.pods[name], 19)  # SIGSTOP: up, but answering nothing
    try:
        assert await backend.sweep([card]) == {}
    finally:
        for name in ("h200-a", "h200-s"):
            os.kill(node.pods[name], 18)  # SIGCONT


async def _eventually_answered(verdict: Callable[[], object]) -> object:
    """The first verdict that is not None (the agents answer once they have started; a
    loaded machine starts an interpreter in seconds, so the wait is generous)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60.0
    while loop.time() < deadline:
        got = await verdict()  # type: ignore[misc]
        if got is not None:
            return got
        await asyncio.sleep(0.05)
    return None


def ip_known(backend: KubernetesBackend, name: str) -> bool:
    pod = backend.observed.get(name)
    return bool(pod and (pod.get("status") or {}).get("podIP"))


def _zygote_of(pid: int) -> int | None:
    """The zygote below the agent ``pid``, standing in for a job's process. The agent has
    short-lived children too (its sandbox probe, its network setup): one of those may be gone
    by the time the card is read, which would make the card look shared."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            parent = int(stat[stat.rfind(b")") + 2 :].split()[1])
            if parent == pid and b"pod_runtime.zygote" in argv:
                return int(entry)
    return None


def test_gpu_share_defaults_are_hamis_names() -> None:
    share = GpuShare()
    assert (share.resource, share.memory_resource, share.cores_resource) == (
        "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")  # fmt: skip
    assert share.uuid_annotation == "nvidia.com/use-gpuuuid"


async def test_an_active_pod_whose_agent_has_no_nvml_gets_no_card_and_its_create_still_succeeds(
    tmp_path: Path,
) -> None:
    """No driver in the pod (NVML's LibraryNotFound, as on this machine): the agent reports
    none, so the pod runs as a GPU pod with no card known and no standby is staged on it."""
    made: list[KubernetesBackend] = []
    with emulated_cluster(tmp_path / "nodes", gpus_per_node=1) as cluster:
        assert cluster.node is not None
        cluster.node.card_file(0).unlink()  # the node's driver is not loaded
        backend = await _backend(cluster, tmp_path, made)
        try:
            pod = await backend.create("h200-a", POOL)
            assert pod.gpu is None
            assert stored_gpu(cluster, "h200-a") is None
            verdicts = await backend.sweep(["GPU-unknown"])
            assert verdicts == {}  # no pod is pinned to it: nothing to judge, nothing changes
        finally:
            for p in await backend.list():
                await backend.delete(p.name)
            for b in made:
                await b.close()
