"""Restart recovery (paper App. A.1): rebuild the tracker, then resume every live job.

Runs once at startup, before the dispatcher takes its first job:
  1. Pods: list the backend's pods; probe each live one's agent; a pod that answers is restored
     with its ownership annotations (owner, tag, queue, release time, hold), so owner holds
     survive the restart; a dead or silent pod is deleted. GPUs restart unverified (standby
     promotion fails closed until a sweep) — the tracker's restore does that.
  2. Jobs: the store is authoritative for job state. QUEUED/PENDING jobs are queued again. For
     each RUNNING job, probe its attempt on its pods: still running → re-attach and wait for
     it; finished during the outage → finalize without a retry; unknown to the agent (never
     launched) or pods gone → re-queue with a fresh attempt id and release the pods.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from gateway.executor import Outcome
from gateway.jobs import Job
from pool_manager.backends.base import BackendPod
from pool_manager.model import PodInfo
from pool_manager.states import JobState, PodState

if TYPE_CHECKING:
    from gateway.broker import Broker

log = logging.getLogger("firepool.recovery")


def _float(value: str | None) -> float | None:
    try:
        return None if value is None else float(value)
    except ValueError:
        return None


def restored_pod(pod: BackendPod) -> PodInfo:
    a = pod.annotations
    return PodInfo(
        name=pod.name, sku=pod.sku, created=pod.created, role=pod.role, gpu=pod.gpu,
        template=pod.template, state=PodState.IDLE, owner=a.get("firepool/owner"),
        tag=a.get("firepool/tag"), queue=a.get("firepool/queue"),
        released_at=_float(a.get("firepool/released-at")) or pod.created,
        hold_until=_float(a.get("firepool/hold-until")),
    )


async def _restore_pods(broker: Broker) -> dict[str, dict[str, Any]]:
    """Restore live pods into the tracker; return each one's health report by name."""
    pods = await broker.backend.list()
    known = {p.name for p in pods if p.sku in broker.catalog.pools}
    health = await asyncio.gather(
        *(broker.agents.health(p.endpoint, timeout=3.0) if p.alive else _none() for p in pods)
    )
    restored: list[PodInfo] = []
    reports: dict[str, dict[str, Any]] = {}
    for pod, report in zip(pods, health, strict=True):
        if report is None or pod.name not in known:
            log.info("deleting pod %s found at startup (alive=%s, answered=%s)",
                     pod.name, pod.alive, report is not None)
            await broker.backend.delete(pod.name)
            continue
        broker.pods.endpoints[pod.name] = pod.endpoint
        restored.append(restored_pod(pod))
        reports[pod.name] = report
    broker.tracker.restore(restored, broker.clock())
    for pod_info in restored:
        pool = broker.catalog.pools[pod_info.sku]
        broker.ledger.force(pool.accelerator, pool.units_per_pod)
    return reports


async def _none() -> None:
    return None


async def _resume_running(broker: Broker, job: Job, reports: dict[str, dict[str, Any]]) -> None:
    dispatcher = broker.dispatcher
    attempt = job.attempts[-1] if job.attempts else None
    pods = attempt.pods if attempt else []
    body = None
    if attempt and pods and all(p in reports for p in pods):
        try:
            body = await broker.agents.result(broker.pods.endpoints[pods[0]], attempt.id)
        except Exception as exc:
            log.warning("job %s: probing %s failed: %r", job.id, attempt.id, exc)
    if attempt is None or body is None:
        # Never launched, or its pods are gone: no user code of this attempt is running.
        revision = job.revision
        if attempt is not None:
            attempt.error = {"class": "PodLost", "message": "not running after broker restart"}
        job.state = JobState.QUEUED
        await broker.jobs.update(job, revision)
        dispatcher.enqueue(job)
        return
    now = broker.clock()
    broker.tracker.adopt(job.id, job.caller, job.lease_tag, job.queue, tuple(pods), now)
    dispatcher.live[job.id] = job
    if body.get("state") == "running":
        log.info("job %s: re-attaching to running attempt %s", job.id, attempt.id)

        async def reattach() -> None:
            timeout = (job.timeout_s or 86400.0) + 30.0
            outcome = await broker.dispatcher.executor.wait(pods[0], attempt.id, timeout)
            await dispatcher.finish(job, pods, outcome)

        dispatcher.spawn(reattach())
    else:
        log.info("job %s: attempt %s finished during the outage", job.id, attempt.id)
        await dispatcher.finish(job, pods, Outcome.from_agent(body))


async def recover(broker: Broker) -> None:
    reports = await _restore_pods(broker)
    jobs = await broker.jobs.jobs_in_states([JobState.PENDING, JobState.QUEUED, JobState.RUNNING])
    for job in jobs:
        if job.state is JobState.RUNNING:
            await _resume_running(broker, job, reports)
        else:
            broker.dispatcher.enqueue(job)
    log.info("recovered %d pods and %d live jobs", len(reports), len(jobs))
