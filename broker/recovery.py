"""Restart recovery (paper App. A.1): rebuild the tracker, then resume every live job.

Runs once at startup, before the dispatcher takes its first job. The job store is
authoritative for job state; pod annotations are authoritative for ownership.
  1. Pods: list the backend's pods and probe each live one's agent, a few times
     (``PROBE_TRIES``, backing off) before a silent one is given up: an agent that is slow
     for a moment (a loaded host) keeps its pod and its job. A silent or dead pod is
     deleted. Pods not bound to a RUNNING job are reset (a crash may have come between a
     job's completion commit and its reset); an unclean one is deleted. The rest are restored
     with their ownership annotations (owner, tag, queue, release time, hold), so owner holds
     survive the restart. GPUs restart unverified
     (standby promotion fails closed until a sweep), which ``Tracker.restore`` guarantees.
  2. Jobs: QUEUED/PENDING jobs are queued again. For each RUNNING job, probe its attempt on
     every one of its pods (each rank of a gang): known to every agent → the pods are
     restored as leased to the job, and the attempt is re-attached (a rank still running:
     every rank is waited for, as a dispatched gang is) or finalized without a retry (every
     rank finished during the outage); a gang rank that failed while the broker was down
     fails the job with that rank's error, the other ranks stopped (``Executor.reattach``);
     unknown to every agent with every pod alive (never launched) → re-queued with a fresh
     attempt id; known to some ranks only (the broker died while launching the gang: those
     ranks wait at the rendezvous for ranks that never come) → those ranks are cancelled and
     the job re-queued as never launched; a pod gone → a ``PodLost`` attempt, re-queued only
     within ``max_retries`` (else the job fails ``PodLost``), as when a pod is lost while the
     broker runs.
  3. Results the pods still hold of jobs the store has ended (a crash between the answer and
     the archiving): the last attempt's log is archived and each result acknowledged.
     A re-attached attempt is waited for as long as a dispatched one
     (``executor.attempt_deadline_s``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from broker.agent_client import AgentUnreachable
from broker.executor import Outcome, attempt_deadline_s
from broker.jobs import Job
from broker.pods import RETIRE_ANNOTATION
from broker.retry_policy import decide
from functions.errors import ErrorClass
from pod_runtime.protocol import AttemptState
from pool_manager.backends.base import BackendPod
from pool_manager.model import PodInfo
from pool_manager.states import TERMINAL_JOB_STATES, JobState, PodState

if TYPE_CHECKING:
    from broker.service import Broker

log = logging.getLogger("firepool.recovery")
PROBE_TRIES = 4
"""How many times recovery asks a live pod's agent (its health, its job's attempt) before it
counts the pod lost."""
PROBE_TIMEOUT_S = 3.0
"""How long each of those asks waits for an answer."""
PROBE_BACKOFF_S = 1.0
"""The pause after the first unanswered ask, doubled after each later one: all pods are asked
at once, so recovery waits at most ``PROBE_TRIES * PROBE_TIMEOUT_S`` plus the pauses (19 s)."""
POD_LOST_ON_RESTART = "its pods were gone after a broker restart"


def _float(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def restored_pod(pod: BackendPod, hold_s: float, now: float) -> PodInfo:
    """A pod as its annotations describe it: idle, held for its last caller if it had one.

    The owner is written before a pod's first job runs, its hold timing only after release
    (best-effort): an owner without a recorded hold gets a full hold from now, never none
    (which would hold it forever) and never a used pod handed to anyone else. A pod marked
    to retire after its job (``RETIRE_ANNOTATION``) keeps that mark: it retires at its job's
    release, or at once if none runs on it (``Tracker.restore``)."""
    a = pod.annotations
    owner = a.get("firepool/owner")
    hold_until = _float(a.get("firepool/hold-until"))
    released_at = _float(a.get("firepool/released-at"))
    if owner is not None and hold_until is None:
        hold_until, released_at = now + hold_s, now
    retire = a.get(RETIRE_ANNOTATION)
    return PodInfo(
        name=pod.name,
        sku=pod.sku,
        created=pod.created,
        role=pod.role,
        gpu=pod.gpu,
        template=pod.template,
        state=PodState.IDLE,
        owner=owner,
        tag=a.get("firepool/tag"),
        queue=a.get("firepool/queue"),
        released_at=released_at or pod.created,
        hold_until=hold_until,
        single_use=retire == "single_use",
        retire_after=retire is not None and retire != "single_use",
    )


async def _live_pods(broker: Broker) -> tuple[dict[str, BackendPod], dict[str, list[str]]]:
    """Backend pods whose agent answers, and the attempts each still holds a result of;
    every other pod is deleted."""
    pods = await broker.backend.list()

    async def probe(pod: BackendPod) -> dict[str, Any] | None:
        if not pod.alive:
            return None
        for tried in range(1, PROBE_TRIES + 1):
            report = await broker.agents.health(pod.endpoint, timeout=PROBE_TIMEOUT_S)
            if report is not None:
                return report
            log.info("pod %s did not answer (try %d of %d)", pod.name, tried, PROBE_TRIES)
            if tried < PROBE_TRIES:
                await asyncio.sleep(PROBE_BACKOFF_S * 2 ** (tried - 1))
        return None

    reports = await asyncio.gather(*(probe(p) for p in pods))
    live: dict[str, BackendPod] = {}
    held: dict[str, list[str]] = {}
    for pod, report in zip(pods, reports, strict=True):
        if report is None or pod.sku not in broker.catalog.pools:
            log.info(
                "deleting pod %s found at startup (alive=%s, answered=%s)",
                pod.name,
                pod.alive,
                report is not None,
            )
            await broker.backend.delete(pod.name)
        else:
            live[pod.name] = pod
            held[pod.name] = [a for a in report.get("attempts", []) if isinstance(a, str)]
            broker.pods.endpoints[pod.name] = pod.endpoint
    return live, held


async def _probe_attempt(
    broker: Broker, job: Job, live: dict[str, BackendPod]
) -> list[dict[str, Any]] | None:
    """Each rank's agent record of the job's current attempt, in rank order, or None if any
    rank's cannot be found. A gang launched on some ranks only (the broker died between its
    rank launches) has its launched ranks cancelled here: it is re-queued as never launched."""
    if not job.attempts:
        return None
    attempt = job.attempts[-1]
    if not attempt.pods or not all(p in live for p in attempt.pods):
        return None

    async def probe(pod: str) -> Any:
        """The agent's answer for the attempt, asked ``PROBE_TRIES`` times with backoff
        while the agent does not answer (a moment's load is no lost pod); None if it never
        does, or fails otherwise."""
        endpoint = live[pod].endpoint
        for tried in range(1, PROBE_TRIES + 1):
            try:
                return await broker.agents.result(endpoint, attempt.id)
            except AgentUnreachable as exc:
                log.info(
                    "job %s: %s on %s did not answer (try %d): %s",
                    job.id, attempt.id, pod, tried, exc,
                )  # fmt: skip
                if tried < PROBE_TRIES:
                    await asyncio.sleep(PROBE_BACKOFF_S * 2 ** (tried - 1))
            except Exception as exc:
                log.warning("job %s: probing %s on %s failed: %r", job.id, attempt.id, pod, exc)
                return None
        return None

    bodies = await asyncio.gather(*(probe(p) for p in attempt.pods))
    if all(isinstance(body, dict) for body in bodies):
        return list(bodies)
    known = [p for p, body in zip(attempt.pods, bodies, strict=True) if body is not None]
    if known:
        log.info("job %s: %s known on %s only; cancelling it there", job.id, attempt.id, known)
        await broker.dispatcher.executor.cancel(known, attempt.id)
    return None


async def recover(broker: Broker) -> None:
    now = broker.clock()
    live, held = await _live_pods(broker)
    jobs = await broker.jobs.jobs_in_states([JobState.PENDING, JobState.QUEUED, JobState.RUNNING])
    infos = {
        name: restored_pod(pod, broker.catalog.pools[pod.sku].hold_s, now)
        for name, pod in live.items()
    }
    attached: list[tuple[Job, list[dict[str, Any]]]] = []
    requeue: list[Job] = []
    for job in jobs:
        if job.state is not JobState.RUNNING:
            requeue.append(job)
            continue
        bodies = await _probe_attempt(broker, job, live)
        if bodies is None:
            if await _lost_while_down(broker, job, live, now):
                requeue.append(job)
            continue
        for name in job.attempts[-1].pods:
            info = infos[name]
            info.state, info.job_id = PodState.RUNNING, job.id
            info.owner, info.tag, info.queue = job.caller, job.lease_tag, job.queue
        attached.append((job, bodies))
    attached_ids = {job.attempts[-1].id for job, _ in attached}
    await _settle_held(broker, live, held, attached_ids)
    await _reset_unbound(broker, live, infos)
    for delete in broker.tracker.restore(infos.values(), now):
        broker.pods.delete(delete.name, delete.reason)
    dispatcher = broker.dispatcher
    for job in requeue:
        if job.sku not in broker.catalog.pools:
            # Its pool left the catalog: it could only wait forever.
            await _fail_unplaceable(broker, job, now)
            continue
        if job.state is JobState.RUNNING:
            # Never launched, or its pods are gone: no user code of this attempt is running.
            revision = job.revision
            if job.attempts and job.attempts[-1].error is None:
                job.attempts[-1].error = {
                    "class": str(ErrorClass.POD_LOST),
                    "message": "not running after a broker restart",
                }
            job.move_to(JobState.QUEUED)
            await broker.jobs.update(job, revision)
        if not job.single_use:
            # The queue reads a single-use function's flag once, at enqueue (a row may predate
            # the job's own flag): load the function so its flag is seen.
            await dispatcher.functions(job.function, job.version)
        dispatcher.enqueue(job)
    for job, bodies in attached:
        pods = list(job.attempts[-1].pods)
        dispatcher.live[job.id] = job
        if len(pods) == 1 and bodies[0].get("state") != AttemptState.RUNNING:
            await dispatcher.finish(
                job, pods, Outcome.from_agent(bodies[0]), cancel_may_be_lost=True
            )
        else:  # running, or a gang: every rank's outcome combined as when dispatched
            dispatcher.spawn(_reattach(broker, job, pods))
    log.info(
        "recovered %d pods, re-attached %d jobs, queued %d", len(infos), len(attached), len(requeue)
    )


async def _fail_unplaceable(broker: Broker, job: Job, now: float) -> None:
    """Fail ``job``, whose pool this broker's catalog no longer has, ``NotFound``."""
    revision = job.revision
    message = f"pool {job.sku!r} is not in this broker's catalog any more"
    job.move_to(JobState.FAILED)
    job.finished = now
    job.error = {"class": str(ErrorClass.NOT_FOUND), "message": message}
    if job.attempts and job.attempts[-1].error is None:
        job.attempts[-1].error = dict(job.error)
        job.attempts[-1].finished = now
    await broker.jobs.update(job, revision)
    log.warning("job %s failed: %s", job.id, message)


async def _lost_while_down(
    broker: Broker, job: Job, live: dict[str, BackendPod], now: float
) -> bool:
    """A RUNNING job whose attempt no live pod knows: True to re-queue it. If its pods are
    all alive the attempt was never launched (no user code ran): re-queued as it is. If any
    is gone, user code may have run and the pod was lost under it: a ``PodLost`` attempt,
    retried only within ``max_retries`` like one lost while the broker ran (a free re-queue
    on every restart would run a ``max_retries=0`` function again and again); else the job
    fails ``PodLost`` here."""
    attempt = job.attempts[-1] if job.attempts else None
    if attempt is None or (attempt.pods and all(p in live for p in attempt.pods)):
        return True
    attempt.error = {"class": str(ErrorClass.POD_LOST), "message": POD_LOST_ON_RESTART}
    decision = decide(
        ErrorClass.POD_LOST, ran_user_code=None, retries=job.retries, max_retries=job.max_retries
    )
    if decision.retry:
        job.retries += 1
        return True
    revision = job.revision
    job.move_to(JobState.FAILED)
    job.error = dict(attempt.error)
    job.finished = attempt.finished = now
    await broker.jobs.update(job, revision)
    log.info("job %s failed: %s (%s)", job.id, POD_LOST_ON_RESTART, decision.reason)
    return False


async def _settle_held(
    broker: Broker,
    live: dict[str, BackendPod],
    held: dict[str, list[str]],
    attached: set[str],
) -> None:
    """Results the pods still hold of attempts whose outcome the store already has (a crash
    came between the answer and their archiving): keep the last attempt's log from rank 0,
    then acknowledge each, so its files go. Otherwise such logs would be lost for good (a log
    read after the restart would be empty) and the agent would keep every attempt's files
    forever."""
    for name, attempt_ids in held.items():
        endpoint = live[name].endpoint
        for attempt_id in attempt_ids:
            if attempt_id in attached:
                continue
            job = await broker.jobs.get_job(attempt_id.rpartition(":")[0])
            if job is not None and job.state not in TERMINAL_JOB_STATES:
                continue  # still the job's own: re-queued or re-attached
            try:
                if job is not None and _is_last_on_rank0(job, attempt_id, name):
                    await broker.recycler.keep_logs(job.id, endpoint, attempt_id)
                await broker.agents.ack(endpoint, attempt_id)
            except AgentUnreachable as exc:
                log.info("pod %s unreachable while settling %s: %s", name, attempt_id, exc)


def _is_last_on_rank0(job: Job, attempt_id: str, pod: str) -> bool:
    """Whether ``attempt_id`` is the job's last attempt and ``pod`` its rank 0: the log kept."""
    last = job.attempts[-1] if job.attempts else None
    return last is not None and last.id == attempt_id and last.pods[:1] == [pod]


async def _reset_unbound(
    broker: Broker, live: dict[str, BackendPod], infos: dict[str, PodInfo]
) -> None:
    """Reset every pod no RUNNING job is bound to: a crash between a job's completion commit
    and its reset leaves the pod dirty (and its result unacknowledged). Unclean → deleted."""
    idle = [name for name, info in infos.items() if info.job_id is None]
    reports = await asyncio.gather(
        *(broker.agents.reset(live[name].endpoint) for name in idle), return_exceptions=True
    )
    for name, report in zip(idle, reports, strict=True):
        if isinstance(report, BaseException) or not report.get("clean"):
            log.info("pod %s did not reset clean after restart (%r); deleting it", name, report)
            del infos[name]
            await broker.backend.delete(name)


async def _reattach(broker: Broker, job: Job, pods: list[str]) -> None:
    attempt_id = job.attempts[-1].id
    try:
        spec = await broker.function_version(job.function, job.version)
    except Exception as exc:
        log.warning("job %s: loading %s v%s failed: %r", job.id, job.function, job.version, exc)
        spec = None
    timeout = attempt_deadline_s(job.timeout_s, spec)  # as long as a dispatched attempt
    outcome = await broker.dispatcher.executor.reattach(pods, attempt_id, timeout)
    await broker.dispatcher.finish(job, pods, outcome, cancel_may_be_lost=True)
