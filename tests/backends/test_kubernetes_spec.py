"""What the kubernetes backend writes and reads, without an API server: the pod built from a
pool's template, the catalog's ``template:`` mapping, the create pacer and the watch's
list-then-watch loop (410 Gone and a failed watch both list again)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.service import Broker
from broker.settings import Settings
from functions.errors import InvalidRequest, UnknownField
from pod_runtime.agent_auth import SECRET_ENV
from pod_runtime.gpu import VISIBLE
from pool_manager.backends.gpu_share import GpuShare
from pool_manager.backends.kubernetes import Pacer
from pool_manager.backends.kubernetes_api import ApiException
from pool_manager.backends.kubernetes_spec import (
    ANNOTATION_GPU,
    LABEL_POOL,
    LABEL_ROLE,
    LABEL_TEMPLATE,
    backend_pod,
    pod_manifest,
    secret_name,
)
from pool_manager.backends.kubernetes_watch import PodWatch
from pool_manager.catalog import Catalog, PoolSpec

TEMPLATE = {
    "image": "registry.example/pod:1",
    "command": ["/venv/bin/python", "-m", "pod_runtime.agent"],
    "resources": {"requests": {"cpu": "2"}, "limits": {"memory": "8Gi"}},
    "node_selector": {"pool": "gpu"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "runtime_class": "gvisor",
    "security_context": {"runAsNonRoot": True},
    "service_account": "firepool-pod",
}


def pool_of(**raw: Any) -> PoolSpec:
    return Catalog.from_mapping({"pools": {"h200": raw}}).pools["h200"]


def test_a_pod_is_built_from_its_pools_template_with_what_recovery_needs() -> None:
    pool = pool_of(accelerator="h200", units_per_pod=2, template=TEMPLATE, preload=["numpy"])
    pod = pod_manifest("h200-a", pool, "active", None, namespace="fp", port=8090, created=12.5)
    meta, spec = pod["metadata"], pod["spec"]
    assert meta["labels"][LABEL_POOL] == "h200" and meta["labels"][LABEL_ROLE] == "active"
    assert len(meta["labels"][LABEL_TEMPLATE]) == 16
    container = spec["containers"][0]
    assert container["command"] == TEMPLATE["command"]
    assert container["args"][:6] == ["--pod-name", "h200-a", "--pod-dir", "/pod", "--listen",
                                     "tcp:0.0.0.0:8090"]  # fmt: skip
    assert "--preload" in container["args"]
    assert container["resources"]["limits"] == {"memory": "8Gi", "nvidia.com/gpu": 2}
    assert container["securityContext"] == {"runAsNonRoot": True}
    secret_env = container["env"][0]
    assert secret_env["name"] == SECRET_ENV
    assert secret_env["valueFrom"]["secretKeyRef"]["name"] == secret_name("h200-a")
    assert (spec["nodeSelector"], spec["runtimeClassName"], spec["serviceAccountName"]) == (
        {"pool": "gpu"}, "gvisor", "firepool-pod")  # fmt: skip
    assert spec["tolerations"] == TEMPLATE["tolerations"]
    assert spec["automountServiceAccountToken"] is False  # jobs get no API token
    back = backend_pod({**pod, "status": {"podIP": "10.1.2.3"}}, 8090)
    assert (back.name, back.sku, back.role, back.created) == ("h200-a", "h200", "active", 12.5)
    assert back.endpoint == "tcp:10.1.2.3:8090#h200-a" and back.template == pool.template
    assert back.annotations == {}  # the backend's own firepool.io/ annotations are not shown


def test_a_standby_asks_for_a_fractional_share_pinned_to_its_actives_card_by_uuid() -> None:
    """Paper §6: the standby's share is a scheduler slot on the active's card (HAMi), pinned
    by the card's UUID; the GPU limits its template names are the active's, not its own."""
    template = {"image": "i", "resources": {"limits": {"nvidia.com/gpu": 1,
                "nvidia.com/gpumem": 130000, "memory": "8Gi"}}}  # fmt: skip
    pool = pool_of(accelerator="h200", standbys_per_active=1, template=template)
    pod = pod_manifest("h200-s", pool, "standby", "GPU-1", namespace="fp", port=1, created=0)
    annotations = pod["metadata"]["annotations"]
    assert annotations[ANNOTATION_GPU] == "GPU-1"
    assert annotations["nvidia.com/use-gpuuuid"] == "GPU-1"
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"memory": "8Gi", "nvidia.com/gpu": 1,
                                                "nvidia.com/gpumem": 256,
                                                "nvidia.com/gpucores": 1}  # fmt: skip
    args = container["args"]
    assert args[args.index("--gpu-uuid") + 1] == "GPU-1" and "--role" in args
    assert args[args.index("--role") + 1] == "standby"
    back = backend_pod(pod, 1)
    assert back.gpu == "GPU-1" and back.annotations == {}


def test_the_gpu_resource_names_and_the_standby_share_are_configurable() -> None:
    share = GpuShare(resource="nvidia.com/vgpu", memory_resource="hami.io/mem",
                     cores_resource="hami.io/cores", standby_memory_mib=512, standby_cores=3,
                     uuid_annotation="hami.io/use-uuid")  # fmt: skip
    pool = pool_of(accelerator="h200", standbys_per_active=1, template={"image": "i"})
    standby = pod_manifest("s", pool, "standby", "GPU-9", namespace="fp", port=1, created=0,
                           share=share)  # fmt: skip
    assert standby["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/vgpu": 1, "hami.io/mem": 512, "hami.io/cores": 3}  # fmt: skip
    assert standby["metadata"]["annotations"]["hami.io/use-uuid"] == "GPU-9"
    active = pod_manifest("a", pool, "active", None, namespace="fp", port=1, created=0,
                          share=share)  # fmt: skip
    container = active["spec"]["containers"][0]
    assert container["resources"]["limits"] == {"nvidia.com/vgpu": 1}
    assert "hami.io/use-uuid" not in active["metadata"]["annotations"]
    args = container["args"]
    assert args[args.index("--gpu-uuid") + 1] == VISIBLE  # its agent takes the cards it sees


def test_an_active_pods_card_is_read_back_from_the_schedulers_annotation() -> None:
    pool = pool_of(accelerator="h200", template={"image": "i"})
    pod = pod_manifest("a", pool, "active", None, namespace="fp", port=1, created=0)
    assert backend_pod(pod, 1).gpu is None  # not bound yet: no card known
    allocated = "GPU-7a1c-33,NVIDIA,130000,0:;"  # what HAMi writes on a bound pod
    pod["metadata"]["annotations"]["hami.io/vgpu-devices-allocated"] = allocated
    back = backend_pod(pod, 1)
    assert back.gpu == "GPU-7a1c-33" and back.annotations == {}
    pod["metadata"]["annotations"][ANNOTATION_GPU] = "GPU-own"  # the backend's own wins
    assert backend_pod(pod, 1).gpu == "GPU-own"
    assert GpuShare().scheduled_cards({"hami.io/vgpu-devices-allocated": "GPU-a,N,1,0:GPU-b,"
                                       "N,1,0:;"}) == ("GPU-a", "GPU-b")  # fmt: skip
    assert GpuShare().scheduled_cards({}) == ()


def test_the_template_version_follows_the_templates_content() -> None:
    one, same = pool_of(template=TEMPLATE), pool_of(template=dict(TEMPLATE))
    other = pool_of(template={**TEMPLATE, "image": "registry.example/pod:2"})
    assert one.template == same.template and one.template.startswith("t-")
    assert other.template != one.template  # pods of the old template retire when idle
    assert pool_of(template="v7").template == "v7" and pool_of(template="v7").pod_template is None


@pytest.mark.parametrize(
    ("template", "error", "field"),
    [
        ({"image": "i", "volumes": []}, UnknownField, "template.volumes"),
        ({"command": ["x"]}, InvalidRequest, "template.image"),
        ({"image": "i", "command": "python -m x"}, InvalidRequest, "template.command"),
        ({"image": "i", "node_selector": {"a": 1}}, InvalidRequest, "template.node_selector"),
        ({"image": "i", "tolerations": {"key": "a"}}, InvalidRequest, "template.tolerations"),
        ({"image": "i", "resources": []}, InvalidRequest, "template.resources"),
        ({"image": "i", "runtime_class": ""}, InvalidRequest, "template.runtime_class"),
    ],
)
def test_a_bad_template_is_refused_naming_its_key(
    template: dict[str, Any], error: type[Exception], field: str
) -> None:
    with pytest.raises(error) as refused:
        pool_of(template=template)
    assert getattr(refused.value, "field", None) == field


async def test_the_pacer_spaces_starts_at_the_rate() -> None:
    now = [100.0]
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    pacer = Pacer(4.0, clock=lambda: now[0], sleep=sleep)
    for _ in range(5):
        await pacer.wait()
    assert slept == [0.25] * 4
    now[0] += 10  # idle: no debt carried
    await pacer.wait()
    assert len(slept) == 4


class ScriptedApi:
    """A ``KubeApi`` stand-in whose lists and watches play a script."""

    def __init__(self, watches: list[list[dict[str, Any]] | Exception]) -> None:
        self.watches = watches
        self.calls: list[tuple[str, str | None]] = []

    def list(self, kind: str, selector: str) -> tuple[list[dict[str, Any]], str | None]:
        self.calls.append(("list", None))
        return [pod("a", "5")], "5"

    def watch(self, kind: str, selector: str, version: str | None, timeout_s: int
              ) -> Iterator[dict[str, Any]]:  # fmt: skip
        self.calls.append(("watch", version))
        if not self.watches:
            threading.Event().wait(0.05)
            raise ApiException(status=0, reason="idle")
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        yield from step


def pod(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version, "labels": {LABEL_POOL: "c"}}}


async def test_the_watch_resumes_from_its_version_and_lists_again_on_410_or_failure() -> None:
    api = ScriptedApi([
        [{"type": "ADDED", "object": pod("b", "6")},
         {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "9"}}}],
        [{"type": "ERROR", "object": {"code": 410, "message": "too old"}}],
        ApiException(status=500, reason="boom"),
        [{"type": "DELETED", "object": pod("a", "12")},
         {"type": "ADDED", "object": {"metadata": {"name": "stranger", "labels": {}}}}],
    ])  # fmt: skip
    seen: list[tuple[str, str]] = []
    lists: list[int] = []
    loop = asyncio.get_running_loop()
    watch = PodWatch(api, LABEL_POOL, loop,  # type: ignore[arg-type]
                     lambda pods, _: lists.append(len(pods)),
                     lambda kind, p: seen.append((kind, p["metadata"]["name"])))  # fmt: skip
    watch.start()
    for _ in range(200):
        if ("DELETED", "a") in seen:
            break
        await asyncio.sleep(0.02)
    watch.stop()
    assert seen == [("ADDED", "b"), ("DELETED", "a")]  # a pod without our label is not ours
    watches = [v for kind, v in api.calls if kind == "watch"]
    assert watches[:2] == ["5", "9"]  # from the list's version, then from the bookmark's
    assert [kind for kind, _ in api.calls][:6] == ["list", "watch", "watch", "list", "watch",
                                                   "list"]  # fmt: skip
    assert lists[:3] == [1, 1, 1]


def test_a_broker_on_kubernetes_without_a_cluster_config_is_refused_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(InvalidRequest, match="in-cluster configuration") as refused:
        Broker(Settings(home=tmp_path / "home", backend="kubernetes"))
    assert refused.value.field == "FIREPOOL_K8S_KUBECONFIG"
    missing = tmp_path / "no-such-kubeconfig"
    with pytest.raises(InvalidRequest, match="no-such-kubeconfig"):
        Broker(Settings(home=tmp_path / "home", backend="kubernetes", k8s_kubeconfig=missing))
    monkeypatch.setenv("FIREPOOL_K8S_NAMESPACE", "Not_A_Namespace")
    with pytest.raises(InvalidRequest, match="FIREPOOL_K8S_NAMESPACE must be a namespace"):
        Settings.from_env()
