"""Kubernetes pod backend (``FIREPOOL_BACKEND=kubernetes``): each pod is a Kubernetes pod of
one namespace, built from its pool's template (``kubernetes_spec``), reached at its pod IP on
the agent port.

State: the API server. Everything recovery needs is on the pods (labels
``firepool.io/pool``, ``/role``, ``/template-hash``; the backend's ``firepool.io/``
annotations; the broker's annotations written by ``annotate``), so a new backend over the
same namespace lists every pod an earlier one made, from one list call.

The view: ``PodWatch`` lists and watches the pods on a thread (resync, bookmarks) and hands
what it reads to the loop (``_on_list``, ``_on_event``): ``observed``. What this backend did
itself is laid over it until the watch shows it, so it reads its own writes at once:
``_pending`` (pods created, not yet observed: counted in flight), ``_written`` (annotations
patched, not yet observed), ``_deleting`` (pods asked to go, still observed). ``list`` and
``exited`` read that view (eventually consistent, as ``base`` allows); no call reads the
API server on their account.

Creates: ``create`` makes the pod's Secret (its agent secret, ``agent_auth.pod_secret``),
then the pod, serialised behind ``_create_lock`` and paced at ``create_qps`` pods a second
(``Pacer``); then it waits, outside the lock, for the watch to show the pod's IP (the
endpoint it returns), or for the pod to fail (``CreateFailed``, the pod deleted). The
Secret is made the pod's (``ownerReferences``) after the create, off the create's path, so
the cluster deletes it with the pod even if this broker is gone by then.

Deletes: ``delete`` asks for the pod and its Secret to go and waits for the watch to show the
pod gone (``delete_wait_s`` at most), outside the create lock: a slow delete never holds up
a create. The broker runs deletes in tasks of their own.

Agent secrets are derived, never stored by the broker: a restarted broker with the same
signing key computes every recovered pod's secret again (``pod_runtime.agent_auth``).

GPUs (``gpu_share``, ``kubernetes_gpu``): an active GPU pod asks for ``units_per_pod`` cards
of the share's resource (unless its template says otherwise) and the scheduler picks them;
``create`` reads the card back from the scheduler's annotation on the pod or, failing that,
from the pod's agent (the cards NVML shows it), and writes it into ``firepool.io/gpu`` so a
restarted broker finds it; a pod whose card cannot be learnt has ``gpu`` None (no standby
joins it). A standby asks for a fractional share of its active's card (``gpu``), pinned by
UUID. ``sweep`` judges each card from the card reports of the agents of every pod pinned to
it, failing closed (``gpus.card_verdict``).

Concurrency: every method runs on the event loop that first used the backend; API calls run
in worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pod_runtime.agent_auth import pod_secret
from pool_manager.backends.base import BackendPod, CreateFailed
from pool_manager.backends.factory import KubernetesOptions
from pool_manager.backends.gpu_share import GpuShare
from pool_manager.backends.kubernetes_api import ApiException, KubeApi, connect
from pool_manager.backends.kubernetes_gpu import AgentGpuReports
from pool_manager.backends.kubernetes_spec import (
    ANNOTATION_GPU,
    LABEL_POOL,
    backend_pod,
    owner_patch,
    pod_card,
    pod_dead,
    pod_ip,
    pod_manifest,
    secret_manifest,
    secret_name,
)
from pool_manager.backends.kubernetes_watch import RESYNC_S, PodWatch
from pool_manager.catalog import PoolSpec

log = logging.getLogger("firepool.kubernetes")

SYNC_TIMEOUT_S = 60.0
"""How long a call waits for the watch's first list before it fails."""


class Pacer:
    """At most ``rate`` starts a second: ``wait`` returns at the next free slot. Use under
    one lock (it keeps no lock of its own). ``clock`` and ``sleep`` are injectable."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Any] = asyncio.sleep,
    ) -> None:
        self.interval = 1.0 / rate
        self.clock = clock
        self.sleep = sleep
        self._next = 0.0

    async def wait(self) -> None:
        now = self.clock()
        if self._next > now:
            await self.sleep(self._next - now)
            now = self._next
        self._next = now + self.interval


class KubernetesBackend:
    """Pods of one namespace, made from their pools' templates."""

    def __init__(
        self,
        api: KubeApi,
        agent_key: bytes,
        *,
        agent_port: int = 8090,
        rendezvous_port: int | None = 29500,
        create_qps: float = 20.0,
        ip_timeout_s: float = 300.0,
        delete_wait_s: float = 30.0,
        resync_s: float = RESYNC_S,
        gpu: GpuShare | None = None,
        card_timeout_s: float = 60.0,
    ) -> None:
        """``ip_timeout_s``: how long a create waits for its pod's IP (image pulls
        included). ``delete_wait_s``: how long a delete waits to see its pod gone. ``gpu``:
        GPU resource names and a standby's share. ``card_timeout_s``: how long a create of an
        active GPU pod the scheduler wrote no card on waits for its agent to report one."""
        self.api = api
        self.agent_key = agent_key
        self.agent_port = agent_port
        self.rendezvous_port = rendezvous_port
        """Declared on every pod; a gang's rank 0 listens on it at its pod IP."""
        self.ip_timeout_s = ip_timeout_s
        self.delete_wait_s = delete_wait_s
        self.resync_s = resync_s
        self.pacer = Pacer(create_qps)
        self.gpu = gpu or GpuShare()
        self.card_timeout_s = card_timeout_s
        self.reports = AgentGpuReports(agent_key, agent_port)
        self.observed: dict[str, dict[str, Any]] = {}
        self._pending: dict[str, tuple[dict[str, Any], float]] = {}
        """Pods created and not yet observed, with when (monotonic) they were created."""
        self._written: dict[str, dict[str, str | None]] = {}
        self._deleting: set[str] = set()
        self._create_lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._synced = asyncio.Event()
        self._watch: PodWatch | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    def connect(cls, options: KubernetesOptions, agent_key: bytes) -> KubernetesBackend:
        """The backend ``options`` say, on the in-cluster configuration or a kubeconfig."""
        return cls(
            KubeApi(connect(options.kubeconfig), options.namespace),
            agent_key,
            agent_port=options.agent_port,
            rendezvous_port=options.rendezvous_port,
            create_qps=options.create_qps,
            gpu=options.gpu,
        )

    # The view, kept on the loop.

    def _start(self) -> None:
        if self._watch is None:
            self._watch = PodWatch(
                self.api, LABEL_POOL, asyncio.get_running_loop(), self._on_list,
                self._on_event, resync_s=self.resync_s,
            )  # fmt: skip
            self._watch.start()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _on_list(self, pods: list[dict[str, Any]], started: float) -> None:
        self.observed = {p["metadata"]["name"]: p for p in pods}
        for name, (_, made) in list(self._pending.items()):
            if name in self.observed or made < started:  # seen, or gone before this list
                del self._pending[name]
        self._deleting &= set(self.observed)
        for name in list(self._written):
            self._confirm(name)
        self._synced.set()
        self._notify()

    def _on_event(self, kind: str, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        if kind == "DELETED":
            self.observed.pop(name, None)
            self._deleting.discard(name)
            self._written.pop(name, None)
        else:
            self.observed[name] = pod
            self._confirm(name)
        self._pending.pop(name, None)
        self._notify()

    def _confirm(self, name: str) -> None:
        """Drop the annotations written to ``name`` that the observed pod shows."""
        written = self._written.get(name)
        pod = self.observed.get(name)
        if written is None:
            return
        if pod is None:
            if name not in self._pending:
                del self._written[name]
            return
        shown = pod["metadata"].get("annotations") or {}
        if all(shown.get(k) == v for k, v in written.items()):
            del self._written[name]

    def _current(self, name: str) -> dict[str, Any] | None:
        """The pod as this backend knows it (its own writes included), or None."""
        if name in self._deleting:
            return None
        pod = self.observed.get(name)
        if pod is None and name in self._pending:
            pod = self._pending[name][0]
        return pod

    def _report(self, pod: dict[str, Any]) -> BackendPod:
        report = backend_pod(pod, self.agent_port, self.gpu)
        for key, value in self._written.get(report.name, {}).items():
            if value is None:
                report.annotations.pop(key, None)
            else:
                report.annotations[key] = value
        return report

    async def _wait_synced(self) -> None:
        self._start()
        try:
            await asyncio.wait_for(self._synced.wait(), SYNC_TIMEOUT_S)
        except TimeoutError:
            raise ApiException(status=0, reason="the pod list never came") from None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # The protocol.

    async def create(
        self, name: str, pool: PoolSpec, role: str = "active", gpu: str | None = None
    ) -> BackendPod:
        """Returns once the pod has an IP (its endpoint), not when it is ready."""
        if pool.is_gpu and role == "standby" and gpu is None:
            raise ValueError("a standby pod needs the card of its active pod")
        if pool.pod_template is None:
            raise CreateFailed(f"pool {pool.sku} has no pod template (template: in the catalog)")
        try:
            await self._wait_synced()
        except ApiException as exc:
            raise CreateFailed(f"the API server did not answer: {exc.reason}") from exc
        if self._current(name) is not None or name in self._deleting:
            raise ValueError(f"pod {name} already exists")
        created = time.time()
        manifest = pod_manifest(name, pool, role, gpu, namespace=self.api.namespace,
                                port=self.agent_port, created=created,
                                rendezvous_port=self.rendezvous_port,
                                share=self.gpu)  # fmt: skip
        secret = secret_manifest(name, pool, pod_secret(self.agent_key, name), self.api.namespace)
        async with self._create_lock:
            await self.pacer.wait()
            pod = await self._post(name, manifest, secret)
        self._pending[name] = (pod, time.monotonic())
        self._notify()
        self._spawn(self._own_secret(pod))
        ip = await self._wait_ip(name)
        if ip is None:
            self._spawn(self.delete(name))
            raise CreateFailed(f"pod {name} got no IP: it failed, was deleted or timed out")
        report = self._report(self._current(name) or pod)
        if pool.is_gpu and report.gpu is None:
            report.gpu = await self._learn_card(name, ip)
        return report

    async def _learn_card(self, name: str, ip: str) -> str | None:
        """The card of an active pod the scheduler wrote none on, from its agent, written
        into ``firepool.io/gpu`` (best effort: a pod whose annotation failed keeps its card
        until a restart, which then finds none and stages no standby on it)."""
        current = self._current(name) or {}
        card = pod_card(current, self.gpu)
        if card is None:

            def gone() -> bool:
                pod = self._current(name)
                return pod is None or pod_dead(pod)

            card = await self.reports.card_of(name, ip, gone, self.card_timeout_s)
        if card is not None:
            patch = {"metadata": {"annotations": {ANNOTATION_GPU: card}}}
            try:
                await asyncio.to_thread(self.api.merge_patch, "pods", name, patch)
            except ApiException as exc:
                log.warning("pod %s: its card %s could not be written on it: %s", name, card,
                            exc.reason)  # fmt: skip
        return card

    async def _post(
        self, name: str, manifest: dict[str, Any], secret: dict[str, Any]
    ) -> dict[str, Any]:
        """The Secret, then the pod; the pod as created. Nothing is left if it fails."""
        try:
            await asyncio.to_thread(self.api.create, "secrets", secret)
        except ApiException as exc:
            if exc.status != 409:  # 409: a Secret left by an earlier pod of this name
                raise CreateFailed(f"the API server refused pod {name}'s secret: "
                                   f"{exc.status} {exc.reason}") from exc  # fmt: skip
            await asyncio.to_thread(self.api.merge_patch, "secrets", secret_name(name), secret)
        try:
            return await asyncio.to_thread(self.api.create, "pods", manifest)
        except ApiException as exc:
            if exc.status == 409:
                raise ValueError(f"pod {name} already exists") from exc
            with contextlib.suppress(ApiException):
                await asyncio.to_thread(self.api.delete, "secrets", secret_name(name))
            raise CreateFailed(f"the API server refused pod {name}: {exc.status} "
                               f"{exc.reason}") from exc  # fmt: skip

    async def _own_secret(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        try:
            await asyncio.to_thread(
                self.api.merge_patch, "secrets", secret_name(name), owner_patch(pod)
            )
        except ApiException as exc:  # ``delete`` removes it by name anyway
            log.warning("pod %s: its secret could not be made its own: %s", name, exc.reason)

    async def _wait_ip(self, name: str) -> str | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ip_timeout_s
        while True:
            pod = self._current(name)
            if pod is None or pod_dead(pod):
                return None
            ip = pod_ip(pod)
            if ip is not None:
                return ip
            left = deadline - loop.time()
            if left <= 0:
                return None
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def delete(self, name: str) -> None:
        """The pod and its Secret asked to go (the pod's agent gets SIGTERM: it kills its
        job and exits); returns when the watch shows the pod gone, or ``delete_wait_s``."""
        self._start()
        self._deleting.add(name)
        self._pending.pop(name, None)
        self._notify()
        try:
            await asyncio.to_thread(self.api.delete, "pods", name)
        except ApiException:
            self._deleting.discard(name)  # still there: listed as it is
            raise
        finally:
            self._spawn(self._delete_secret(name))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.delete_wait_s
        while name in self.observed and loop.time() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), deadline - loop.time())
        if name in self.observed:
            log.warning("pod %s still terminating after %.0f s", name, self.delete_wait_s)

    async def _delete_secret(self, name: str) -> None:
        try:
            await asyncio.to_thread(self.api.delete, "secrets", secret_name(name))
        except ApiException as exc:  # owned by the pod: the cluster collects it
            log.warning("pod %s: its secret could not be deleted: %s", name, exc.reason)

    async def list(self) -> list[BackendPod]:
        await self._wait_synced()
        names = (set(self.observed) | set(self._pending)) - self._deleting
        return [self._report(pod) for name in sorted(names) if (pod := self._current(name))]

    async def annotate(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """A merge patch of the pod's annotations; durable once it returns."""
        self._start()
        patch = {"metadata": {"annotations": dict(annotations)}}
        try:
            await asyncio.to_thread(self.api.merge_patch, "pods", name, patch)
        except ApiException as exc:
            if exc.status == 404:
                return
            raise
        written = self._written.setdefault(name, {})
        written.update(annotations)
        self._confirm(name)

    async def sweep(self, gpus: Sequence[str]) -> dict[str, bool]:
        """Each card's exclusivity from the reports of the agents of every live pod pinned
        to it (``kubernetes_gpu``); cards no agent answered for are left out."""
        pods: dict[str, list[tuple[str, str]]] = {}
        for name in set(self.observed) - self._deleting:
            pod = self.observed[name]
            card, ip = pod_card(pod, self.gpu), pod_ip(pod)
            if card is not None and ip is not None and not pod_dead(pod):
                pods.setdefault(card, []).append((name, ip))
        return await self.reports.sweep(gpus, pods)

    async def exited(self, name: str) -> bool:
        """The pod is not in this backend's view, is being deleted, or has stopped."""
        pod = self._current(name)
        return pod is None or pod_dead(pod)

    async def close(self) -> None:
        """Stops the watch; the pods keep running."""
        if self._watch is not None:
            self._watch.stop()
        await self.reports.close()
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await task
