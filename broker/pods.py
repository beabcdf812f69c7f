"""The pod lifecycle shell: carries out the control plane's create/delete decisions.

The tracker decides; this module does the I/O. Creates are recorded in the tracker (STARTING)
*before* the backend call is awaited, so the next scaler pass counts them as supply and never
issues them twice; a failed create is reported back (``pod_gone``) and its budget released.
Readiness is probed over the agent protocol; a pod that never answers is deleted.

Concurrency: everything runs on the event loop; the tracker's own lock is held only inside its
methods, never across an ``await``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Collection, Mapping

from broker.agent_client import AgentClient
from broker.background import BackgroundTasks
from broker.telemetry import NO_TELEMETRY, Telemetry
from pool_manager.backends.base import PodBackend
from pool_manager.catalog import Catalog
from pool_manager.model import CreatePod, DeletePod, PodInfo
from pool_manager.states import PodState
from pool_manager.tracker import Tracker

log = logging.getLogger("firepool.pods")

READY_PROBE_MIN_S = 0.005
READY_PROBE_MAX_S = 0.2
READY_PROBE_FRACTION = 0.1
EXITED_CHECK_S = 0.5
"""How often a pod that is not ready yet is checked for having stopped (``PodBackend.exited``)."""
IDLE_CHECK_S = 2.0
"""How often idle pods are checked for having stopped (``PodManager.retire_exited``)."""
RETIRE_ANNOTATION = "firepool/retire-after"
"""Set on a pod before a job runs on it that the pod must not outlive (a single-use job, or
one that recycled another session's pod): a broker restarted meanwhile retires the pod
after that job, or at once if the job has ended (``broker.recovery.restored_pod``). Without
it a restart would forget the retirement and the pod would serve its caller again as warm."""
CREATE_BACKOFF_MIN_S = 1.0
CREATE_BACKOFF_MAX_S = 60.0
"""A pool whose pods fail to start (the backend refuses the create, or the pod stops or never
answers before it is ready) gets no new create for 1 s after the first failure, doubling to
60 s; the first pod of the pool that becomes ready ends it. (Without it a create the backend
always refuses, a GPU pool on a host without that GPU, would be retried in a tight loop:
11,000 to 16,000 log lines in 10 s and half a core.)"""


class CreateFailures:
    """One pool's pods failing to start, in a row (``PodManager.create_failures``)."""

    __slots__ = ("count", "last_error", "until")

    def __init__(self) -> None:
        self.count = 0
        self.last_error = ""
        self.until = 0.0
        """Event-loop time before which the pool gets no create."""

    def backoff_s(self) -> float:
        return min(CREATE_BACKOFF_MAX_S, CREATE_BACKOFF_MIN_S * 2 ** max(0, self.count - 1))


def ready_probe_delay(elapsed_s: float) -> float:
    """The pause before the next readiness probe of a pod started ``elapsed_s`` ago: a tenth
    of that, between 5 and 200 ms. So a pod is seen ready at most ~10% after it is (a local
    pod's 0.35 s start: within ~35 ms), while a pod that takes 20 s is probed no more often
    than 5 times a second. (A plain doubling from 5 ms to the same 200 ms cap saw a local
    pod ready at 0.33 s only at the 0.52 s probe: +60% on every new pod.)"""
    return min(READY_PROBE_MAX_S, max(READY_PROBE_MIN_S, READY_PROBE_FRACTION * elapsed_s))


def new_pod_name(sku: str, suffix: str | None = None) -> str:
    """A pod's name: its pool's, then 8 random hex digits (``suffix`` fixes them)."""
    return f"{sku}-{suffix if suffix is not None else secrets.token_hex(4)}"


def pool_of(name: str) -> str:
    """The pool a pod's name (``new_pod_name``) says it is of."""
    return name.rpartition("-")[0] or name


class PodManager:
    def __init__(
        self,
        backend: PodBackend,
        tracker: Tracker,
        catalog: Catalog,
        agents: AgentClient,
        clock: Callable[[], float],
        on_change: Callable[[], None],
        ready_timeout_s: float = 60.0,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self.backend = backend
        self.telemetry = telemetry
        self.tracker = tracker
        self.catalog = catalog
        self.agents = agents
        self.clock = clock
        self.on_change = on_change
        self.ready_timeout_s = ready_timeout_s
        self.endpoints: dict[str, str] = {}
        self._tasks = BackgroundTasks()
        self._deleting: set[str] = set()
        self._pending_notes: dict[str, dict[str, str | None]] = {}
        """Per pod, the hold timing not yet handed to the backend (``annotate_later``)."""
        self._flushing: set[str] = set()
        """Pods whose ``_flush_notes`` task runs (one per pod: writes stay in order)."""
        self.create_failures: dict[str, CreateFailures] = {}
        """Per pool, its pods failing to start in a row (cleared by one becoming ready)."""

    def apply(self, action: CreatePod | DeletePod, demand: Collection[str] = ()) -> None:
        """Carry out one of the scaler's actions. ``demand``: the pools with jobs left
        waiting in the pass that planned it, which is why an active pod of one of them is
        created (the metrics' create reason: ``demand``, else ``warm_target``, a floor or an
        idle target; a standby pod is ``standby``)."""
        if isinstance(action, CreatePod):
            name = new_pod_name(action.sku)
            pool = self.catalog.pool(action.sku)
            now = self.clock()
            failing = self.create_failures.get(action.sku)
            if failing is not None and asyncio.get_running_loop().time() < failing.until:
                # Backing off: dropped as a failed create is (its reserved units released),
                # without asking the backend or waking the dispatcher; the wake comes when
                # the backoff ends.
                if self.tracker.add_pod(
                    PodInfo(name=name, sku=action.sku, created=now, role=action.role,
                            gpu=action.gpu, template=pool.template),
                    now,
                ):  # fmt: skip
                    self.tracker.pod_gone(name, now)
                return
            tracked = self.tracker.add_pod(
                PodInfo(
                    name=name,
                    sku=action.sku,
                    created=now,
                    role=action.role,
                    gpu=action.gpu,
                    template=pool.template,
                ),
                now,
            )
            if tracked:  # False: a standby whose card emptied since the plan
                reason = (
                    "standby"
                    if action.role == "standby"
                    else "demand"
                    if action.sku in demand
                    else "warm_target"
                )
                self.telemetry.pod_create(action.sku, action.role, reason)
                self._tasks.spawn(self._create(name, action))
        else:
            self.delete(action.name, action.reason)

    async def _create(self, name: str, action: CreatePod) -> None:
        pool = self.catalog.pool(action.sku)
        asked = asyncio.get_running_loop().time()
        try:
            pod = await self.backend.create(name, pool, role=action.role, gpu=action.gpu)
        except Exception as exc:
            self.telemetry.pod_create_failed(action.sku, "refused")
            self._failed(action.sku, f"create of pod {name} failed: {exc!r}")
            self.tracker.pod_gone(name, self.clock())
            self.on_change()
            return
        self.endpoints[name] = pod.endpoint
        if await self.wait_ready(name, pod.endpoint):
            elapsed = asyncio.get_running_loop().time() - asked
            self.telemetry.pod_ready(action.sku, action.role, elapsed)
            self.create_failures.pop(action.sku, None)
            self.tracker.pod_ready(name, self.clock(), gpu=pod.gpu)
            self.on_change()
        elif name not in self._deleting:  # not deleted on purpose while it started
            self.telemetry.pod_create_failed(action.sku, "never_ready")
            self._failed(action.sku, f"pod {name} never became ready")
            self.delete(name, "never became ready")

    def _failed(self, sku: str, error: str) -> None:
        """A pod of ``sku`` failed to start: back the pool off, say so once per failure, and
        wake the dispatcher when the backoff ends (its creates were dropped meanwhile)."""
        failing = self.create_failures.setdefault(sku, CreateFailures())
        loop = asyncio.get_running_loop()
        if loop.time() >= failing.until:  # pods that failed together are one failure
            failing.count += 1
        failing.last_error = error
        delay = failing.backoff_s()
        failing.until = loop.time() + delay
        log.warning("%s; pool %s gets no new pod for %.0f s (failure %d in a row)",
                    error, sku, delay, failing.count)  # fmt: skip
        loop.call_later(delay, self.on_change)

    async def wait_ready(self, name: str, endpoint: str) -> bool:
        """Probe the agent until it answers (``ready_probe_delay`` apart), the pod is being
        deleted, its backend reports it stopped (checked every ``EXITED_CHECK_S``, or a pod
        killed while it starts would be waited for until the timeout), or ``ready_timeout_s``
        has passed."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        deadline = start + self.ready_timeout_s
        next_check = start + EXITED_CHECK_S
        while loop.time() < deadline:
            if name in self._deleting:
                return False
            if await self.agents.health(endpoint, timeout=1.0) is not None:
                return True
            if loop.time() >= next_check:
                if await self.backend.exited(name):
                    log.warning("pod %s stopped before it became ready", name)
                    return False
                next_check = loop.time() + EXITED_CHECK_S
            await asyncio.sleep(ready_probe_delay(loop.time() - start))
        return False

    async def retire_exited(self) -> list[str]:
        """Retire and delete every idle pod whose backend reports it stopped (its agent
        died, or someone killed it): otherwise the next claim takes it and that job fails
        ``PodLost``. A pod claimed between the check and the retire is left to its job.
        Returns the pods retired."""
        idle = [pod.name for pod in self.tracker.pods() if pod.state is PodState.IDLE]
        gone = [name for name in idle if await self.backend.exited(name)]
        retired = []
        for name in gone:
            if self.tracker.retire(name, "exited_while_idle", self.clock()):
                log.warning("pod %s stopped while idle; deleting it", name)
                self.delete(name, "exited_while_idle")
                retired.append(name)
        if retired:
            self.on_change()  # a pool below its floor, or a job that wanted it, replans
        return retired

    def delete(self, name: str, reason: str) -> None:
        if name in self._deleting:
            return
        self._deleting.add(name)
        pod = self.tracker.get(name)
        self.telemetry.pod_delete(pod.sku if pod is not None else pool_of(name), reason)
        self._tasks.spawn(self._delete(name, reason))

    async def _delete(self, name: str, reason: str) -> None:
        log.info(
            "deleting pod %s: %s", name, reason,
            extra={"event": "pod_deleted", "pod": name, "pool": pool_of(name), "reason": reason},
        )  # fmt: skip
        endpoint = self.endpoints.pop(name, None)
        if endpoint is not None:
            await self.agents.forget(endpoint)
        try:
            await self.backend.delete(name)
        finally:
            self._deleting.discard(name)
            self.tracker.pod_gone(name, self.clock())
            self.on_change()

    async def persist_owner(
        self,
        names: tuple[str, ...],
        owner: str | None,
        tag: str | None,
        queue: str | None,
        retire: str | None = None,
    ) -> None:
        """Record, before the job launches (awaited, unlike holds), a pod's first caller
        (``owner``, ``tag``, ``queue``; None: leave them as recorded) and ``retire``: why
        the pod must retire after this job (``single_use``, ``session_boundary``; see
        ``RETIRE_ANNOTATION``). Raises if any write fails: the launch must not go ahead
        then, or a restarted broker could hand the used pod to another caller, or back to
        the session it left, as a warm pod."""
        note: dict[str, str | None] = {}
        if owner is not None:
            note.update({"firepool/owner": owner, "firepool/tag": tag, "firepool/queue": queue})
        if retire is not None:
            note[RETIRE_ANNOTATION] = retire
        await asyncio.gather(*(self.backend.annotate(name, note) for name in names))

    async def annotate_now(self, name: str, annotations: Mapping[str, str | None]) -> None:
        try:
            await self.backend.annotate(name, annotations)
        except Exception as exc:  # best-effort by design (paper A.1 step 4)
            log.warning("annotating pod %s failed: %r", name, exc)

    def annotate_later(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Persist hold timing off the job's path. Writes per pod are coalesced and applied in
        order by one task, so an older write never lands after a newer one; one made while
        the pod's last write is under way is written after it (a write hands the backend its
        own copy, so nothing merged later is taken for written)."""
        pending = self._pending_notes.get(name)
        if pending is not None:
            pending.update(annotations)
            return
        self._pending_notes[name] = dict(annotations)
        if name not in self._flushing:
            self._flushing.add(name)
            self._tasks.spawn(self._flush_notes(name))

    async def _flush_notes(self, name: str) -> None:
        try:
            while (notes := self._pending_notes.pop(name, None)) is not None:
                await self.annotate_now(name, notes)
        finally:
            self._flushing.discard(name)

    async def drain(self) -> None:
        await self._tasks.drain()
