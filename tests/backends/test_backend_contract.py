"""The pod backend contract (``pool_manager/backends/base.py``), held against every backend.

Each test runs once per backend: ``local`` (real ``pod_runtime`` agent processes, so its
cases are few and make one or two pods each), ``kubernetes`` (against kmock's emulated API
server, with a node emulator starting a real agent per pod: ``k8s_node_emulator``) and
``fake`` (in-memory pods in this event loop). A ``Harness`` gives what differs between them: a
new backend object over the same state, a way to make a pod die (``stop_pod`` for a local or
emulated-node pod, as an operator's kill; ``kill`` for a fake one), the pool the tests create
pods of, and a create that the backend must refuse. Every agent call carries the pod's secret
(``AgentClient(KEY)``), as the broker's do.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from broker.agent_client import AgentClient
from pod_runtime.agent_auth import agent_key
from pool_manager.backends.base import BackendPod, CreateFailed, PodBackend
from pool_manager.backends.fake import FakeBackend
from pool_manager.backends.gpus import GpuInventory
from pool_manager.backends.kubernetes import KubernetesBackend
from pool_manager.backends.kubernetes_api import KubeApi, connect
from pool_manager.backends.local import LocalBackend, free_tcp_port, stop_pod
from pool_manager.catalog import PodTemplate, PoolSpec
from tests.backends.k8s_node_emulator import NAMESPACE, emulated_cluster

KEY = agent_key(b"contract".ljust(32))
CPU = PoolSpec(sku="cpu")
CPU_TEMPLATE = PoolSpec(sku="cpu", pod_template=PodTemplate(image="firepool-pod:test"))
"""The same pool with a pod template, as the kubernetes backend needs."""
GPU = PoolSpec(sku="gpu", accelerator="no-such-card")
"""A GPU pool no machine has a card of: a local create must fail."""
READY_S = 30.0


def no_packages(digest: str) -> BinaryIO:
    return io.BytesIO(b"")  # the contract's attempts carry no package


@dataclass
class Harness:
    kind: str
    root: Path
    new_backend: Callable[[], PodBackend]
    """A new backend object over the same state (what a restarted broker builds)."""
    kill: Callable[[str], Awaitable[None]]
    """Make the pod die as a crash or an operator's kill would."""
    refusing: Callable[[], tuple[PodBackend, PoolSpec]]
    """A backend and a pool whose next create the backend cannot carry out."""
    cpu: PoolSpec = CPU
    """The pool the tests make pods of."""


@pytest.fixture(params=["local", "kubernetes", "fake"])
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    root = tmp_path / "pods"

    async def kill_process(name: str) -> None:
        await asyncio.to_thread(stop_pod, root / name)

    if request.param == "local":
        yield Harness(
            "local",
            root,
            lambda: LocalBackend(root, agent_key=KEY),
            kill_process,
            lambda: (LocalBackend(root, gpus=GpuInventory({}), agent_key=KEY), GPU),
        )
        survivors = LocalBackend(root)
        for pod in await survivors.list():
            await survivors.delete(pod.name)
        return
    if request.param == "kubernetes":
        with emulated_cluster(root) as cluster:
            kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
            port = free_tcp_port("127.0.0.1")
            made: list[KubernetesBackend] = []

            def kubernetes() -> KubernetesBackend:
                api = KubeApi(connect(kubeconfig), NAMESPACE)
                made.append(KubernetesBackend(api, KEY, agent_port=port, ip_timeout_s=30))
                return made[-1]

            yield Harness("kubernetes", root, kubernetes, kill_process,
                          lambda: (kubernetes(), CPU), CPU_TEMPLATE)  # fmt: skip
            survivors = kubernetes()
            for pod in await survivors.list():
                await survivors.delete(pod.name)
            for backend in made:
                await backend.close()
        return
    fake = FakeBackend(root, no_packages)
    yield Harness(
        "fake",
        root,
        lambda: FakeBackend(root, no_packages),
        fake.kill,
        lambda: (FakeBackend(root, no_packages, fail_creates=1), CPU),
    )
    await fake.shutdown()


@pytest.fixture
async def agents() -> AsyncIterator[AgentClient]:
    client = AgentClient(KEY)
    yield client
    await client.close()


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = READY_S) -> bool:
    """Whether ``check`` holds within ``timeout_s`` (asked every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def ready(agents: AgentClient, pod: BackendPod) -> bool:
    async def answers() -> bool:
        return await agents.health(pod.endpoint, timeout=1.0) is not None

    return await eventually(answers)


def listed(pods: list[BackendPod]) -> dict[str, BackendPod]:
    return {pod.name: pod for pod in pods}


async def test_a_created_pod_is_listed_alive_and_answers_its_health_probe(
    harness: Harness, agents: AgentClient
) -> None:
    backend = harness.new_backend()
    pod = await backend.create("cpu-a", harness.cpu)
    assert (pod.name, pod.sku, pod.role, pod.annotations) == ("cpu-a", "cpu", "active", {})
    assert pod.endpoint.startswith(("unix:", "tcp:"))
    assert await ready(agents, pod)
    health = await agents.health(pod.endpoint)
    assert health is not None and health["pod"] == "cpu-a" and health["busy"] is False
    assert listed(await backend.list())["cpu-a"].alive
    assert not await backend.exited("cpu-a")
    with pytest.raises(ValueError, match="exists"):  # names are unique
        await backend.create("cpu-a", harness.cpu)


async def test_a_deleted_pod_is_gone_and_deleting_again_is_no_error(
    harness: Harness, agents: AgentClient
) -> None:
    backend = harness.new_backend()
    pod = await backend.create("cpu-a", harness.cpu)
    assert await ready(agents, pod)
    await backend.delete("cpu-a")
    assert "cpu-a" not in listed(await backend.list())
    assert await backend.exited("cpu-a")
    await agents.forget(pod.endpoint)  # a fresh connection: the old one may be closing
    assert await agents.health(pod.endpoint, timeout=1.0) is None
    await backend.delete("cpu-a")
    await backend.delete("cpu-never-made")


async def test_annotations_merge_none_removes_and_a_gone_pod_is_no_error(
    harness: Harness,
) -> None:
    backend = harness.new_backend()
    await backend.create("cpu-a", harness.cpu)
    await backend.annotate("cpu-a", {"firepool/owner": "alice", "firepool/tag": "t1"})
    await backend.annotate("cpu-a", {"firepool/tag": None, "firepool/hold-until": "12.5"})
    pod = listed(await backend.list())["cpu-a"]
    assert pod.annotations == {"firepool/owner": "alice", "firepool/hold-until": "12.5"}
    pod.annotations["firepool/owner"] = "mallory"  # a snapshot: the pod's own are untouched
    assert listed(await backend.list())["cpu-a"].annotations["firepool/owner"] == "alice"
    await backend.annotate("cpu-never-made", {"firepool/owner": "bob"})
    assert "cpu-never-made" not in listed(await backend.list())


async def test_a_new_backend_over_the_same_state_lists_the_pods_the_old_one_made(
    harness: Harness, agents: AgentClient
) -> None:
    """What a restarted broker rebuilds its view from (paper A.1)."""
    old = harness.new_backend()
    made = await old.create("cpu-a", harness.cpu)
    await old.annotate("cpu-a", {"firepool/owner": "alice"})
    await old.close()
    new = harness.new_backend()
    pod = listed(await new.list())["cpu-a"]
    assert (pod.sku, pod.role, pod.endpoint, pod.alive) == ("cpu", "active", made.endpoint, True)
    assert pod.annotations == {"firepool/owner": "alice"}
    assert await ready(agents, pod)  # it kept running when the old backend closed
    await new.delete("cpu-a")
    assert listed(await harness.new_backend().list()) == {}


async def test_a_create_the_backend_cannot_carry_out_raises_create_failed_and_leaves_nothing(
    harness: Harness,
) -> None:
    backend, pool = harness.refusing()
    with pytest.raises(CreateFailed):
        await backend.create("pod-refused", pool)
    assert "pod-refused" not in listed(await backend.list())
    assert await backend.exited("pod-refused")
    assert not (harness.root / "pod-refused").exists()


async def test_a_pod_that_dies_is_exited_and_listed_dead_until_deleted(
    harness: Harness, agents: AgentClient
) -> None:
    backend = harness.new_backend()
    pod = await backend.create("cpu-a", harness.cpu)
    assert await ready(agents, pod)
    await harness.kill("cpu-a")

    async def exited() -> bool:
        return await backend.exited("cpu-a")

    assert await eventually(exited, 5.0)
    assert not listed(await backend.list())["cpu-a"].alive
    await agents.forget(pod.endpoint)
    assert await agents.health(pod.endpoint, timeout=1.0) is None
    await backend.delete("cpu-a")
    assert "cpu-a" not in listed(await backend.list())


def spec(attempt_id: str, entrypoint: str, payload: Any, wait: bool) -> dict[str, Any]:
    """An attempt with no package: ``entrypoint`` comes from what the pod has installed."""
    return {"attempt_id": attempt_id, "package": None, "entrypoint": entrypoint,
            "input": payload, "timeout_s": 30, "wait": wait}  # fmt: skip


async def test_an_attempt_runs_end_to_end_through_the_agent_protocol(
    harness: Harness, agents: AgentClient
) -> None:
    """What the broker's executor and recycler do with a pod: run (waiting, and not), read
    the result and the log, acknowledge, reset."""
    backend = harness.new_backend()
    pod = await backend.create("cpu-a", harness.cpu)
    assert await ready(agents, pod)

    status, result = await agents.start(
        pod.endpoint, spec("job1:1", "json:loads", '{"x": [1, 2]}', wait=True), timeout=30
    )
    assert status == 200, result
    assert (result["state"], result["output"]) == ("succeeded", {"x": [1, 2]}), result
    assert result["started"] <= result["finished"]
    await agents.ack(pod.endpoint, "job1:1")
    assert await agents.result(pod.endpoint, "job1:1") is None  # forgotten once acknowledged
    reset = await agents.reset(pod.endpoint)
    assert reset["clean"], reset

    status, body = await agents.start(
        pod.endpoint, spec("job2:1", "builtins:print", "hello from job2", wait=False), timeout=30
    )
    assert (status, body) == (202, {"attempt_id": "job2:1"})
    polled = await agents.result(pod.endpoint, "job2:1", wait_s=20.0)
    assert polled is not None and polled["state"] == "succeeded", polled
    log = await agents.logs(pod.endpoint, "job2:1")
    assert log is not None and b"hello from job2" in log.data and log.done, log
    status, refused = await agents.start(
        pod.endpoint, {**spec("job3:1", "json:loads", "1", wait=True), "bogus": 1}, timeout=30
    )
    assert status == 400 and refused["error"]["class"] == "UnknownField", refused
