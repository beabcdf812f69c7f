"""Template rollout on the kubernetes backend (paper App. C.3), through kmock's emulated API
server and the node emulator (``k8s_node_emulator``: a real pod agent per pod): a pool's pod
template edited in the mounted catalog file under steady load retires the old pods at most
``drain_budget`` at a time, never holds more pods than its ceiling, loses no job, and ends
with every pod in the API made from the new template."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.harness import free_port
from pool_manager.backends.kubernetes_api import KubeApi, connect
from pool_manager.backends.kubernetes_spec import LABEL_POOL, LABEL_TEMPLATE, template_hash
from tests.backends.k8s_node_emulator import NAMESPACE, emulated_cluster
from tests.conftest import deploy_examples
from tests.helpers import ThreadedBroker, threaded_broker
from tests.rollout_load import Census, Load, wait


def _catalog(cpu: str) -> str:
    return (
        "budgets: {cpu: 10}\n"
        "pools:\n"
        "  cpu:\n"
        "    min_count: 2\n"
        "    max_idle_count: 3\n"
        "    max_count: 3\n"
        "    drain_budget: 1\n"
        "    idle_timeout_s: 600\n"
        "    caller_hold_s: 600\n"
        "    template:\n"
        "      image: firepool-pod:test\n"
        f"      resources: {{requests: {{cpu: {cpu}, memory: 128Mi}}}}\n"
    )


@pytest.fixture
def k8s_broker(tmp_path: Path) -> Iterator[tuple[ThreadedBroker, KubeApi]]:
    with emulated_cluster(tmp_path / "nodes") as cluster:
        kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
        settings = {
            "backend": "kubernetes",
            "k8s_kubeconfig": kubeconfig,
            "k8s_namespace": NAMESPACE,
            "k8s_agent_port": free_port(),
            "catalog_poll_s": 0.1,
        }
        with threaded_broker(tmp_path / "home", _catalog("100m"), **settings) as server:
            deploy_examples(server, {"noop": "noop:noop"})
            yield server, KubeApi(connect(kubeconfig), NAMESPACE)


def test_a_template_edit_rolls_out_within_the_drain_budget_and_the_ceiling(
    k8s_broker: tuple[ThreadedBroker, KubeApi],
) -> None:
    server, api = k8s_broker
    b = server.broker
    census = Census(b.tracker)
    path = b.settings.catalog_path
    assert path is not None

    def cluster_pods() -> dict[str, str]:
        return {
            p["metadata"]["name"]: p["metadata"]["labels"][LABEL_TEMPLATE]
            for p in api.list("pods", LABEL_POOL)[0]
            if not p["metadata"].get("deletionTimestamp")
        }

    load = Load(server, callers=3)  # as many callers as the ceiling: saturated
    try:
        wait("jobs before the edit", lambda: len(load.states) >= 20)
        old_hash = template_hash(b.catalog.pools["cpu"])
        assert set(cluster_pods().values()) == {old_hash}
        path.write_text(_catalog("200m"))  # a ConfigMap update, as the kubelet writes it
        wait("the reload", lambda: template_hash(b.catalog.pools["cpu"]) != old_hash, 10)
        new_hash = template_hash(b.catalog.pools["cpu"])
        at_edit = len(load.states)
        seen: list[int] = []

        def rolled() -> bool:
            pods = cluster_pods()
            seen.append(len(pods))
            return bool(pods) and set(pods.values()) == {new_hash}

        wait("every pod on the new template", rolled, 180)
        wait("jobs on the new pods", lambda: len(load.states) >= at_edit + 20)
    finally:
        load.stop()
    assert set(load.states) == {"SUCCEEDED"}, f"{len(load.states)} jobs: {set(load.states)}"
    most, most_retiring = census.peaks()
    assert most <= 3, f"{most} pods at once: past the ceiling 3"
    assert len(most_retiring) <= 1, f"{most_retiring} retiring at once: past the budget 1"
    assert max(seen) <= 3, f"the API held {max(seen)} live pods of the pool"
    pods = b.tracker.pods()
    assert pods and {p.template for p in pods} == {b.catalog.pools["cpu"].template}
