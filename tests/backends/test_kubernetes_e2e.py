"""The broker on the kubernetes backend, end to end: a ``firepool serve`` process with
``FIREPOOL_BACKEND=kubernetes`` over real HTTP, its pods made through the Kubernetes API.

Where: by default kmock's emulated API server with our node emulator, which starts a real pod
agent for each pod (``k8s_node_emulator``). With ``FIREPOOL_TEST_KUBECONFIG`` set, the same
tests run on that real cluster (kind, k3d) instead: docs/kubernetes.md says what that cluster
needs (the pod image, pod IPs routed to this machine, the broker's URL reachable from pods).

Held here: deploy and invoke; warm reuse by the same caller and tag; no pod reuse across
callers; a broker killed by SIGKILL and started again with an empty home (only its signing
key kept) restores the owner holds from the pods' annotations alone; and a pod's agent
refuses any call without that pod's secret (401).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from broker.keys import load_or_create_key
from gateway.auth import Authenticator, Role
from gateway.harness import BrokerServer, free_port, start_broker, wait_ready
from pod_runtime.agent_auth import agent_key, bearer, pod_secret
from pool_manager.backends.kubernetes_api import KubeApi, connect
from pool_manager.backends.kubernetes_spec import LABEL_POOL, LABEL_ROLE, secret_name
from tests.backends.k8s_node_emulator import NAMESPACE, EmulatedCluster, emulated_cluster
from tests.conftest import EXAMPLES

REAL = os.environ.get("FIREPOOL_TEST_KUBECONFIG")
IMAGE = os.environ.get("FIREPOOL_TEST_IMAGE", "firepool-pod:test")
"""The pod image (on a real cluster: one the nodes can pull, built from docker/)."""


@dataclass
class Cluster:
    """Where the tests' pods live: what a broker is pointed at, and a way to read its pods."""

    kubeconfig: Path
    namespace: str
    env: dict[str, str]
    """The broker's environment for this cluster."""
    emulated: EmulatedCluster | None = None
    """The emulated API server and node, when there is no real cluster."""

    def pods(self) -> dict[str, dict[str, Any]]:
        api = KubeApi(connect(self.kubeconfig), self.namespace)
        return {p["metadata"]["name"]: p for p in api.list("pods", LABEL_POOL)[0]}

    def delete_all(self) -> None:
        api = KubeApi(connect(self.kubeconfig), self.namespace)
        for name in self.pods():
            api.delete("pods", name, grace_s=0)
            api.delete("secrets", secret_name(name))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("k8s")
    if REAL:
        namespace = os.environ.get("FIREPOOL_TEST_NAMESPACE", "default")
        yield Cluster(Path(REAL), namespace, _broker_env(Path(REAL), namespace, 8090))
        return
    with emulated_cluster(root / "nodes") as emulated:
        kubeconfig = emulated.kubeconfig(root / "kubeconfig")
        port = free_port()  # every pod has its own IP; one port for all, as on a cluster
        yield Cluster(kubeconfig, NAMESPACE, _broker_env(kubeconfig, NAMESPACE, port), emulated)


def _broker_env(kubeconfig: Path, namespace: str, port: int) -> dict[str, str]:
    return {
        "FIREPOOL_BACKEND": "kubernetes",
        "FIREPOOL_K8S_KUBECONFIG": str(kubeconfig),
        "FIREPOOL_K8S_NAMESPACE": namespace,
        "FIREPOOL_K8S_AGENT_PORT": str(port),
    }


def _start(home: Path, env: dict[str, str], port: int | None = None) -> BrokerServer:
    """``firepool serve`` on the cluster. On a real one it listens on
    ``FIREPOOL_TEST_BROKER_HOST`` (default all addresses) and tells pods to reach it at
    ``FIREPOOL_TEST_PUBLIC_HOST`` (an address of this machine the pods can reach)."""
    if not REAL:
        return start_broker(home, CATALOG, port=port, extra_env=env)
    port = port or free_port()
    public = os.environ.get("FIREPOOL_TEST_PUBLIC_HOST", "127.0.0.1")
    env = {**env, "FIREPOOL_PUBLIC_URL": f"http://{public}:{port}"}
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    (home / "catalog.yaml").write_text(CATALOG)
    env["FIREPOOL_CATALOG"] = str(home / "catalog.yaml")
    host = os.environ.get("FIREPOOL_TEST_BROKER_HOST", "0.0.0.0")
    with (home / "broker.log").open("ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--host", host, "--port", str(port)],
            env={**os.environ, "FIREPOOL_HOME": str(home), **env}, stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, proc, home / "broker.log")
    return BrokerServer(url, home, proc, Authenticator(load_or_create_key(home / "signing.key")))


CATALOG = f"""\
budgets: {{cpu: 10}}
pools:
  cpu:
    min_count: 0
    max_idle_count: 2
    max_count: 10
    idle_timeout_s: 300
    template:
      image: {IMAGE}
      resources: {{requests: {{cpu: 100m, memory: 128Mi}}}}
"""


@contextlib.contextmanager
def _broker(cluster: Cluster, home: Path) -> Iterator[list[BrokerServer]]:
    """A broker process on the cluster, ``noop`` and ``whoami`` deployed; the list holds the
    current process (a test may kill and replace it). Its pods are deleted afterwards."""
    server = _start(home, cluster.env)
    holder = [server]
    try:
        _deploy(server)
        yield holder
    finally:
        holder[0].stop()
        cluster.delete_all()


@pytest.fixture(scope="module")
def broker(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    """One broker the module's tests share (none kills it)."""
    with _broker(cluster, tmp_path_factory.mktemp("home")) as holder:
        yield holder[0]


@pytest.fixture
def crashy(cluster: Cluster, tmp_path: Path) -> Iterator[list[BrokerServer]]:
    """A broker of the test's own, for it to kill."""
    with _broker(cluster, tmp_path / "home") as holder:
        yield holder


def _deploy(server: BrokerServer) -> None:
    with server.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop", timeout_s=30)
        fp.deploy(Path(__file__).parents[1] / "gateway" / "behaviours", name="whoami", sku="cpu",
                  entrypoint="behaviours:whoami", timeout_s=30)  # fmt: skip


def _pod(job: dict[str, Any]) -> str:
    return str(job["attempts"][-1]["pods"][0])


def test_a_broker_killed_and_restarted_with_an_empty_home_restores_holds_from_annotations(
    crashy: list[BrokerServer], cluster: Cluster, tmp_path: Path
) -> None:
    """First in the module: its broker has the namespace to itself (two brokers over one
    namespace each delete the other's pods as not theirs). Nothing of the first broker's
    home is kept but its signing key (from which every pod's agent secret derives): no job
    store, no pod records. The pods' labels and annotations alone tell the new broker which
    caller holds which pod."""
    old = crashy[0]
    with old.client("k8s-holder") as fp:
        first = fp.invoke("whoami", None, lease_tag="s")
    old.kill()  # SIGKILL: nothing is flushed, no pod is touched
    home = tmp_path / "new-home"
    home.mkdir(mode=0o700)
    shutil.copy(old.home / "signing.key", home / "signing.key")
    crashy[0] = _start(home, cluster.env, port=int(old.url.rsplit(":", 1)[1]))
    _deploy(crashy[0])
    with crashy[0].client("k8s-holder") as fp:
        again = fp.invoke("whoami", None, lease_tag="s")
    with crashy[0].client("k8s-stranger") as fp:
        other = fp.invoke("whoami", None, lease_tag="s")
    assert again["acquisition"]["path"] == "warm", again["acquisition"]
    assert _pod(again) == _pod(first)
    assert _pod(other) != _pod(first)


def test_a_deployed_function_runs_on_a_pod_made_from_the_pools_template(
    broker: BrokerServer, cluster: Cluster
) -> None:
    with broker.client("k8s-alice") as fp:
        job = fp.invoke("noop", {"x": 1}, lease_tag="s1")
    assert job["state"] == "SUCCEEDED" and job["output"] == {"x": 1}, job
    pod = cluster.pods()[_pod(job)]
    labels, container = pod["metadata"]["labels"], pod["spec"]["containers"][0]
    assert (labels[LABEL_POOL], labels[LABEL_ROLE]) == ("cpu", "active")
    assert container["image"] == IMAGE
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "128Mi"}
    annotations = pod["metadata"]["annotations"]
    assert annotations["firepool/owner"] == "k8s-alice"  # the hold, on the pod itself
    assert annotations["firepool/tag"] == "s1"


def test_same_caller_and_tag_runs_warm_on_the_same_pod_and_no_pod_crosses_callers(
    broker: BrokerServer,
) -> None:
    with broker.client("k8s-bob") as fp:
        first = fp.invoke("noop", 1, lease_tag="t")
        second = fp.invoke("noop", 2, lease_tag="t")
    assert second["acquisition"] == {"path": "warm", "reason": None}
    assert _pod(second) == _pod(first)
    runs: dict[str, set[str]] = {}
    for caller in ("k8s-carol", "k8s-dave", "k8s-bob"):
        with broker.client(caller) as fp:
            for i in range(3):
                runs.setdefault(_pod(fp.invoke("noop", i, lease_tag="t")), set()).add(caller)
    shared = {pod: who for pod, who in runs.items() if len(who) > 1}
    assert shared == {}, f"cross-caller reuse: {shared}"


def test_an_agent_call_without_the_pods_secret_is_refused(
    broker: BrokerServer, cluster: Cluster
) -> None:
    with broker.client("k8s-erin") as fp:
        job = fp.invoke("noop", 1)
    name = _pod(job)
    pod = cluster.pods()[name]
    url = f"http://{pod['status']['podIP']}:{cluster.env['FIREPOOL_K8S_AGENT_PORT']}"
    key = agent_key(load_or_create_key(broker.home / "signing.key"))
    spec = {"attempt_id": "intruder:1", "package": None, "entrypoint": "json:loads",
            "input": "1", "timeout_s": 30, "wait": True}  # fmt: skip
    for headers in ({}, bearer("0" * 64), bearer(pod_secret(key, name + "-other"))):
        assert httpx.post(f"{url}/attempts", json=spec, headers=headers).status_code == 401
        assert httpx.post(f"{url}/reset", json={}, headers=headers).status_code == 401
    assert httpx.get(f"{url}/healthz").json() == {
        "pod": name,
        "authorized": False,
    }  # a probe: up, nothing more
    health = httpx.get(f"{url}/healthz", headers=bearer(pod_secret(key, name)))
    assert health.status_code == 200 and "attempts" in health.json()
    secret = KubeApi(connect(cluster.kubeconfig), cluster.namespace).request(
        "GET", f"/api/v1/namespaces/{cluster.namespace}/secrets/{secret_name(name)}"
    )
    assert secret["metadata"]["ownerReferences"][0]["name"] == name  # collected with the pod


def test_the_backend_lists_and_watches_by_label_with_bookmarks_from_a_version(
    broker: BrokerServer, cluster: Cluster
) -> None:
    """kmock ignores label selectors, resourceVersion and bookmarks (every pod is listed, a
    watch replays everything): what the backend asks for is asserted on the requests it sent."""
    if cluster.emulated is None:
        pytest.skip("asserts on the emulated server's request log; a real server checks these")
    with broker.client("k8s-frank") as fp:
        fp.invoke("noop", 1)
    pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
    mine = [(m, q) for m, p, q in cluster.emulated.requests() if p == pods and "labelSelector" in q]
    lists = [q for m, q in mine if m == "GET" and q.get("watch") != "true"]
    watches = [q for m, q in mine if m == "GET" and q.get("watch") == "true"]
    assert lists and all(q["labelSelector"] == LABEL_POOL for q in lists)
    assert watches and all(q["labelSelector"] == LABEL_POOL for q in watches)
    assert all(q["allowWatchBookmarks"] == "true" and q.get("resourceVersion") for q in watches)
    assert all(int(q["timeoutSeconds"]) > 0 for q in watches)  # it ends, and is resumed
    creates = [p for m, p, _ in cluster.emulated.requests() if m == "POST"]
    assert creates.count(pods) >= 1
    assert creates.count(f"/api/v1/namespaces/{NAMESPACE}/secrets") == creates.count(pods)


def test_the_same_tests_run_on_a_real_cluster_when_one_is_given() -> None:
    """The opt-in suite: this module against ``FIREPOOL_TEST_KUBECONFIG``'s cluster."""
    if not REAL:
        pytest.skip("FIREPOOL_TEST_KUBECONFIG is not set: the kubernetes end-to-end tests ran "
                    "on the emulated API server only (docs/kubernetes.md: running them on kind "
                    "or k3d)")  # fmt: skip
    assert Path(REAL).is_file(), f"FIREPOOL_TEST_KUBECONFIG={REAL} is not a file"
