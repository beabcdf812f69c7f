"""A Kubernetes cluster for tests with no cluster: kmock's emulated API server, plus a node
emulator of our own that plays the kubelet, both on an event loop in a thread of their own
(``EmulatedCluster``), so a backend in the test's loop, a broker in a thread or a broker
process all reach them over real HTTP on loopback (``kubeconfig``).

The node emulator watches pods through the API as a kubelet does. For each new pod it starts a
REAL local pod agent (``local.spawn_agent``, as the local backend does, without a sandbox:
the emulator is the container runtime) with the pod's own arguments, its secret read from the
pod's Secret (what ``secretKeyRef`` gives a container), listening at the pod's IP (a loopback
address of its own, ``127.n.x.y``) on the pod's agent port; then writes the pod's status back
(Running, podIP, hostIP, Ready, and the node in ``spec.nodeName``) and a finalizer of its
own, so that a delete, as on a real cluster, only marks the pod (``deletionTimestamp``) until
the emulator has stopped its agent (``local.stop_pod``) and removed the finalizer. An agent
that dies is reported as a terminated container, phase Failed. ``run_agents=False`` starts
no agent (status only: the scale benchmark's 2,000 pods).

Nodes: ``nodes`` emulated nodes (``node-0``, ``node-1``...) take pods in turn, each with a
pod address range of its own (``127.n.<node's block>.y``, its ``hostIP`` ``127.n.<block>.254``),
as a cluster's nodes each route a pod CIDR: two pods on two nodes have addresses that differ
beyond the last byte, and a job on one reaches a port a job on the other binds at its pod IP
only through that address (Linux routes all of 127.0.0.0/8 to ``lo``, so every address is
local: what differs from real nodes is that nothing separates them, no firewall nor latency).

GPUs (``gpus_per_node``): each node has that many emulated cards (``GPU-e<net>-n<node>-c<k>``)
and plays the scheduler of a GPU-sharing cluster (HAMi) for pods asking for ``nvidia.com/gpu``:
a pod pinned by ``nvidia.com/use-gpuuuid`` goes to the node of that card and shares it; any
other takes a card no other unpinned pod holds, on the next node in turn that has one (none
free: the pod stays pending, with no IP). With ``scheduler_annotations`` the emulator writes
the card into the pod's ``hami.io/vgpu-devices-allocated`` as HAMi does; without it the pod's
agent is the only source of its card. Each agent it starts finds the node's "driver": the
emulated ``pynvml`` (``emulated_nvml/pynvml.py``, first on its ``PYTHONPATH``) over the node's
card file, showing it only the card it was given, as a container sees only its own. Limits:
no card exists, so no real job ever shows on one; a card lists the compute processes a test
writes (``set_card``) and nothing else; the shares' memory and cores are not enforced or even
counted (a node takes any number of pinned pods), and the agents share the host's PID
namespace, so an agent always resolves a pid NVML lists (on a cluster that needs a driver
that translates pids, or ``hostPID``: docs/kubernetes.md).

What kmock does not do (each written beside the test that needs it): it ignores label
selectors (every pod of the namespace is listed and watched: the backend filters by its label
itself), keeps no resourceVersion (lists say ``...``, objects have none, a watch from any
version replays every object as ADDED, so the backend's resume-from-version is exercised only
as a request), sends no bookmarks, ignores ``timeoutSeconds`` (a watch never ends on its own:
the backend's read timeout ends it), gives objects no uid, answers a create 200 rather than
201, and collects nothing by ownerReferences (the backend deletes a pod's Secret by name too).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import random
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
from aiohttp import test_utils, web_server
from aiohttp.web_runner import ServerRunner
from kmock import KubernetesEmulator, Server

from pod_runtime.agent_auth import SECRET_ENV
from pool_manager.backends.local import meta_path, pid_alive, pod_environment, spawn_agent, stop_pod

NAMESPACE = "firepool"
FINALIZER = "node-emulator.firepool.test/agent"
"""Held on every pod whose agent runs, so a delete waits for the agent to stop."""
GPU_RESOURCE = "nvidia.com/gpu"
PIN_ANNOTATION = "nvidia.com/use-gpuuuid"
ALLOCATED_ANNOTATION = "hami.io/vgpu-devices-allocated"
EMULATED_NVML = Path(__file__).parent / "emulated_nvml"
"""Where the emulated ``pynvml`` lives: put first on each agent's ``PYTHONPATH``."""
CARD_MIB = 143771
"""An emulated card's framebuffer (an H200's, as NVML reports it)."""


def kubeconfig_text(url: str, namespace: str = NAMESPACE) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "emulated",
        "clusters": [{"name": "emulated", "cluster": {"server": url}}],
        "users": [{"name": "emulated", "user": {"token": "emulated"}}],
        "contexts": [{"name": "emulated",
                      "context": {"cluster": "emulated", "user": "emulated",
                                  "namespace": namespace}}],
    })  # fmt: skip


def _arg(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def _with(args: list[str], flag: str, value: str) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = value
    return args


class LoggingEmulator(KubernetesEmulator):
    """kmock's emulated API server with a request log of our own. kmock routes each request
    by testing it against every request it has logged (so a test can assert on filtered
    views of the log): quadratic, a second per request past a few hundred. This keeps only
    the request in flight in kmock's log, and (method, path, query) of every request in
    ``log``, what the tests assert on."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.log: list[tuple[str, str, dict[str, str]]] = []

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        self.log.append((raw_request.method.upper(), raw_request.path, dict(raw_request.query)))
        del self._requests[:]  # before it logs this one
        return await super().__call__(raw_request)


class QuickServer(test_utils.RawTestServer):
    """kmock's HTTP server, stopped without waiting for its open watches: they stream until
    their client goes, which a backend's watch thread may do only at its read timeout."""

    async def _make_runner(self, debug: bool = True, **kwargs: Any) -> ServerRunner:
        server = web_server.Server(self._handler, loop=self._loop, debug=debug, **kwargs)
        return ServerRunner(server, debug=debug, shutdown_timeout=0.2, **kwargs)


class NodeEmulator:
    """The kubelet of every pod of ``namespace`` (see the module docstring). Runs on the
    cluster's loop; talks to the API server only over HTTP."""

    def __init__(
        self,
        url: str,
        root: Path,
        namespace: str,
        run_agents: bool,
        nodes: int = 1,
        gpus_per_node: int = 0,
        scheduler_annotations: bool = False,
    ) -> None:
        self.url = url
        self.root = root
        self.namespace = namespace
        self.run_agents = run_agents
        self.pods: dict[str, int] = {}
        """Pods with a running agent: name -> pid."""
        self.started: dict[str, str] = {}
        """Pods given an IP: name -> IP."""
        self._net = random.randrange(2, 250)
        """The second byte of this cluster's pod IPs (127.<net>.x.y): clusters of parallel
        test runs rarely share addresses."""
        self.nodes = [f"node-{i}" for i in range(nodes)]
        self.placed: dict[str, str] = {}
        """Pods given a node: name -> node name."""
        self._next_ip = [0] * nodes
        self._placements = 0
        self.scheduler_annotations = scheduler_annotations
        self.cards: dict[str, int] = {
            f"GPU-e{self._net:03d}-n{node}-c{k}": node
            for node in range(nodes)
            for k in range(gpus_per_node)
        }
        """Every emulated card: UUID -> its node."""
        self.allocated: dict[str, str] = {}
        """Pods given a card: name -> card."""
        self.whole: set[str] = set()
        """Pods given a card of their own (not pinned to a shared one)."""
        self._children: set[int] = set()
        self._http: aiohttp.ClientSession | None = None
        for node in range(nodes):
            cards = [c for c, n in self.cards.items() if n == node]
            self.write_cards(node, [{"uuid": c, "name": "NVIDIA H200",
                                     "memory_total_mib": CARD_MIB, "readable": True,
                                     "processes": []} for c in cards])  # fmt: skip

    def card_file(self, node: int) -> Path:
        return self.root / f"nvml-node-{node}.json"

    def write_cards(self, node: int, cards: list[dict[str, Any]]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.card_file(node).with_suffix(".tmp")
        tmp.write_text(json.dumps({"cards": cards}))
        os.replace(tmp, self.card_file(node))

    def set_card(
        self, uuid: str, readable: bool | None = None, processes: list[int] | None = None
    ) -> None:
        """Change what the node's driver says of card ``uuid``: whether its processes can be
        read, and which pids compute on it."""
        node = self.cards[uuid]
        cards = json.loads(self.card_file(node).read_text())["cards"]
        for card in cards:
            if card["uuid"] == uuid:
                if readable is not None:
                    card["readable"] = readable
                if processes is not None:
                    card["processes"] = [{"pid": p, "used_mib": 1024} for p in processes]
        self.write_cards(node, cards)

    def _card_for(self, pod: dict[str, Any]) -> tuple[int, str] | bool | None:
        """The node and card a pod asking for a GPU gets; None: no card is free (it stays
        pending); False: it asks for none."""
        container = pod["spec"]["containers"][0]
        limits = (container.get("resources") or {}).get("limits") or {}
        if GPU_RESOURCE not in limits:
            return False
        pin = (pod["metadata"].get("annotations") or {}).get(PIN_ANNOTATION)
        if pin is not None:
            return (self.cards[pin], pin) if pin in self.cards else None
        held = {self.allocated[n] for n in self.whole}
        for step in range(len(self.nodes)):
            node = (self._placements + step) % len(self.nodes)
            for card, at in self.cards.items():
                if at == node and card not in held:
                    return node, card
        return None

    def _path(self, kind: str, name: str | None = None) -> str:
        base = f"{self.url}/api/v1/namespaces/{self.namespace}/{kind}"
        return base if name is None else f"{base}/{name}"

    async def _patch(self, name: str, body: dict[str, Any]) -> None:
        assert self._http is not None
        async with self._http.patch(
            self._path("pods", name), data=json.dumps(body),
            headers={"Content-Type": "application/merge-patch+json"},
        ) as resp:  # fmt: skip
            await resp.read()

    NODE_BLOCK = 32
    """Third bytes each node's pod addresses span (250 pods each)."""

    def _place(self, node: int | None = None) -> tuple[str, str, str]:
        """The next pod's node (``node``, else in turn), its pod IP in that node's range,
        the node's IP."""
        if node is None:
            node = self._placements % len(self.nodes)
        self._placements += 1
        self._next_ip[node] += 1
        n = self._next_ip[node]
        block = node * self.NODE_BLOCK
        ip = f"127.{self._net}.{block + n // 250}.{n % 250 + 1}"
        return self.nodes[node], ip, f"127.{self._net}.{block}.254"

    async def run(self) -> None:
        self._http = aiohttp.ClientSession()
        try:
            await asyncio.gather(self._watch(), self._monitor())
        finally:
            await self._http.close()

    async def _watch(self) -> None:
        assert self._http is not None
        while True:
            try:
                async with self._http.get(
                    self._path("pods"), params={"watch": "true"},
                    timeout=aiohttp.ClientTimeout(total=None),
                ) as resp:  # fmt: skip
                    async for line in resp.content:
                        if line.strip():
                            event = json.loads(line)
                            await self._handle(event["type"], event["object"])
            except (aiohttp.ClientError, ValueError):
                await asyncio.sleep(0.05)

    async def _handle(self, kind: str, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        name = meta["name"]
        if kind == "DELETED" or meta.get("deletionTimestamp"):
            await self._stop(name, release=kind != "DELETED")
        elif name not in self.started and not (pod.get("status") or {}).get("podIP"):
            await self._start(pod)

    async def _start(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        container = pod["spec"]["containers"][0]
        gpu = self._card_for(pod)
        if gpu is None:
            return  # no free card: pending
        if gpu is False:
            node, ip, host_ip = self._place()
            card = None
        else:
            assert isinstance(gpu, tuple)
            node_index, card = gpu
            node, ip, host_ip = self._place(node_index)
            self.allocated[name] = card
            if PIN_ANNOTATION not in (pod["metadata"].get("annotations") or {}):
                self.whole.add(name)
        self.started[name] = ip
        self.placed[name] = node
        if self.run_agents:
            port = container["ports"][0]["containerPort"]
            env = pod_environment(os.environ)
            env[SECRET_ENV] = await self._secret(container)
            env["FIREPOOL_TEST_NVML_STATE"] = str(self.card_file(self.nodes.index(node)))
            env["FIREPOOL_TEST_NVML_VISIBLE"] = card or ""
            env["PYTHONPATH"] = str(EMULATED_NVML)
            pod_dir = self.root / name
            pod_dir.mkdir(parents=True, exist_ok=True)
            args = _with(container["args"], "--pod-dir", str(pod_dir))
            args = _with(args, "--listen", f"tcp:{ip}:{port}")
            argv = [sys.executable, "-P", "-m", "pod_runtime.agent", *args]
            pid = spawn_agent(argv, env, pod_dir / "agent.log")
            meta_path(pod_dir).write_text(json.dumps({"pid": pid, "name": name}))
            self.pods[name] = pid
            self._children.add(pid)
        status = {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": host_ip,
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "agent", "ready": True, "state": {"running": {}}}],
        }  # fmt: skip
        body: dict[str, Any] = {"spec": {"nodeName": node}, "status": status, "metadata": {}}
        if self.run_agents:
            body["metadata"]["finalizers"] = [FINALIZER]
        if card is not None and self.scheduler_annotations:
            allocated = f"{card},NVIDIA,{CARD_MIB},0:;"
            body["metadata"]["annotations"] = {ALLOCATED_ANNOTATION: allocated}
        await self._patch(name, body)

    async def _secret(self, container: dict[str, Any]) -> str:
        assert self._http is not None
        ref = next(e for e in container["env"] if e["name"] == SECRET_ENV)
        ref = ref["valueFrom"]["secretKeyRef"]
        async with self._http.get(self._path("secrets", ref["name"])) as resp:
            secret = await resp.json()
        return base64.b64decode(secret["data"][ref["key"]]).decode()

    async def _stop(self, name: str, release: bool) -> None:
        self.started.pop(name, None)
        self.allocated.pop(name, None)
        self.whole.discard(name)
        pid = self.pods.pop(name, None)
        if pid is not None:
            await asyncio.to_thread(stop_pod, self.root / name, self._reap)
        if release:
            await self._patch(name, {"metadata": {"finalizers": None}})

    def _reap(self) -> None:
        """Collect the agents this emulator started that exited (only those: the test
        process has children of its own)."""
        for pid in list(self._children):
            try:
                done = os.waitpid(pid, os.WNOHANG)[0]
            except ChildProcessError:
                done = pid
            if done:
                self._children.discard(pid)

    async def _monitor(self) -> None:
        """Report agents that died (killed, crashed) as terminated containers."""
        while True:
            await asyncio.sleep(0.1)
            self._reap()
            for name, pid in list(self.pods.items()):
                if not pid_alive(pid):
                    del self.pods[name]
                    await self._patch(name, {"status": {
                        "phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}],
                        "containerStatuses": [{"name": "agent", "ready": False,
                                               "state": {"terminated": {"exitCode": 137}}}],
                    }})  # fmt: skip

    def stop_all(self) -> None:
        for name in list(self.pods):
            stop_pod(self.root / name, self._reap)
        self.pods.clear()


class EmulatedCluster:
    """kmock's API server and the node emulator on a loop in a thread of their own."""

    def __init__(
        self,
        root: Path,
        namespace: str = NAMESPACE,
        run_agents: bool = True,
        nodes: int = 1,
        gpus_per_node: int = 0,
        scheduler_annotations: bool = False,
    ) -> None:
        self.root = root
        self.namespace = namespace
        self.run_agents = run_agents
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.scheduler_annotations = scheduler_annotations
        self.url = ""
        self.kmock: LoggingEmulator | None = None
        self.node: NodeEmulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopped: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="emulated-cluster", daemon=True)

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopped = asyncio.Event()
        async with LoggingEmulator() as kmock, Server(kmock, server_cls=QuickServer) as server:
            kmock.resources["v1/pods"] = {}
            kmock.resources["v1/secrets"] = {}
            self.kmock = kmock
            self.url = str(server.url).rstrip("/")
            self.node = NodeEmulator(
                self.url, self.root, self.namespace, self.run_agents, self.nodes,
                self.gpus_per_node, self.scheduler_annotations,
            )  # fmt: skip
            node = asyncio.create_task(self.node.run())
            self._ready.set()
            await self._stopped.wait()
            node.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await node
            await asyncio.to_thread(self.node.stop_all)

    def start(self) -> EmulatedCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self._thread.start()
        assert self._ready.wait(30), "the emulated cluster did not start"
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
        self._thread.join(30)

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(kubeconfig_text(self.url, self.namespace))
        return path

    def objects(self, kind: str) -> dict[str, dict[str, Any]]:
        """The live objects of ``kind`` (``pods``, ``secrets``) by name, as stored."""
        assert self.kmock is not None
        found = {}
        for (resource, _, name), obj in list(self.kmock.objects.items()):
            if resource.plural == kind and not obj.deleted:
                found[name] = obj.raw
        return found

    def requests(self) -> list[tuple[str, str, dict[str, str]]]:
        """Every request the API server got so far: (method, path, query)."""
        assert self.kmock is not None
        return list(self.kmock.log)

    def wait_until(self, check: Any, timeout_s: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


@contextlib.contextmanager
def emulated_cluster(
    root: Path,
    run_agents: bool = True,
    nodes: int = 1,
    gpus_per_node: int = 0,
    scheduler_annotations: bool = False,
) -> Iterator[EmulatedCluster]:
    cluster = EmulatedCluster(
        root, run_agents=run_agents, nodes=nodes, gpus_per_node=gpus_per_node,
        scheduler_annotations=scheduler_annotations,
    ).start()  # fmt: skip
    try:
        yield cluster
    finally:
        cluster.stop()
