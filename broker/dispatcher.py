"""The dispatcher: queued jobs → claimed pods → durable RUNNING commit → launch → completion.

Each pass, woken by submit, release or pod-ready (a tick only as a fallback):
  1. Observe: nothing to poll; backend and agent events were folded into the tracker as they
     arrived (pod ready, pod gone, release).
  2. Claim: take queued jobs in priority order and claim each job's full pod set from the
     tracker in one step. A job that cannot be placed is skipped, so smaller jobs behind it
     proceed, and it becomes demand.
  3. Scale: hand the demand to the scaler (pure) and carry out its creates/deletes.
Then, per claimed job, off the pass: commit QUEUED→RUNNING (version-checked; a failed commit
returns the pods), launch through the executor, record the outcome, reset and release pods.

No user code runs before the RUNNING commit. Concurrency: one event loop; tracker calls never
span an ``await``; each job is mutated only by the task that currently owns it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from enum import Enum
from typing import Any

from broker.background import BackgroundTasks
from broker.executor import Executor, Outcome
from broker.jobs import Attempt, Job
from broker.lifecycle import PodRecycler
from broker.pods import PodManager
from broker.retry_policy import decide
from broker.store import JobStore, StaleRevision
from broker.telemetry import NO_TELEMETRY, Telemetry
from functions.errors import ErrorClass, FirepoolError, TooLarge
from functions.spec import FunctionSpec
from pod_runtime.protocol import AttemptState
from pool_manager.claim_queue import ClaimQueue
from pool_manager.dispatch_pass import dispatch_pass
from pool_manager.model import ClaimRequest, Lease
from pool_manager.states import TERMINAL_JOB_STATES, IllegalTransition, JobState
from pool_manager.tracker import Tracker

log = logging.getLogger("firepool.dispatcher")


class Recorded(Enum):
    """What ``Dispatcher._record_outcome`` committed."""

    OUTCOME = "outcome"
    TOO_LARGE = "too_large"
    """A ``TooLarge`` failure in place of an outcome the store could not hold."""


_RECORD_RETRY_MAX_S = 5.0
"""Longest pause between two tries to record an outcome while the store is down."""


def _retry_note(job: Job) -> str:
    """`` (retry N after CLASS)`` for a job queued again after a failed attempt, else ``""``."""
    if not job.retries:
        return ""
    error = job.attempts[-1].error if job.attempts else None
    return f" (retry {job.retries} after {(error or {}).get('class', 'a failed attempt')})"


class WaitReleased(Exception):
    """A ``wait`` answered before its job ended (``Dispatcher.release_waiters``)."""


class Dispatcher:
    """Owns the in-memory queue and every live (queued or running) job."""

    def __init__(
        self,
        store: JobStore,
        tracker: Tracker,
        pods: PodManager,
        executor: Executor,
        recycler: PodRecycler,
        functions: Callable[[str, int], Coroutine[Any, Any, FunctionSpec | None]],
        clock: Callable[[], float],
        tick_s: float = 3.0,
        reconcile_s: float = 5.0,
        telemetry: Telemetry = NO_TELEMETRY,
    ) -> None:
        self.store = store
        self.telemetry = telemetry
        self.tracker = tracker
        self.pods = pods
        self.executor = executor
        self.recycler = recycler
        self.functions = functions
        self.clock = clock
        self.tick_s = tick_s
        self.reconcile_s = reconcile_s
        self.live: dict[str, Job] = {}
        self.finishing: dict[str, Job] = {}
        """Jobs whose attempt ended and whose outcome is not yet in the store, as the store
        has them: what a read or a cancel sees meanwhile (``finish``)."""
        self.starting: dict[str, Job] = {}
        """Jobs whose RUNNING commit is in flight, as the store has them (queued)."""
        self.counters: Counter[str] = Counter()
        """Prometheus counters: ``path_<path>`` per claim, ``jobs_<state>`` per terminal job."""
        self._queue = ClaimQueue()
        """Every queued job's claim request, in dispatch order (priority, then age); the jobs
        themselves are in ``live``."""
        self._waiters: dict[str, list[asyncio.Future[Job]]] = {}
        self._cancel_requested: set[str] = set()
        self._wake = asyncio.Event()
        self._tasks = BackgroundTasks()
        self._next_reconcile = 0.0
        self._replan = True
        self._new_demand = False
        self._stopping = False
        self.specs: dict[tuple[str, int], FunctionSpec] = {}

    # -- intake -------------------------------------------------------------------------
    def wake(self) -> None:
        self._wake.set()

    def replan(self) -> None:
        """Something changed that the scaler must see (a new job, a pod ready or gone): plan
        on the next pass rather than at the next reconcile tick."""
        self._replan = True
        self._wake.set()

    def enqueue(self, job: Job) -> None:
        """Queue a job; the next pass claims for it and plans capacity only if it is left
        waiting (a warm claim changes nothing the scaler must see)."""
        self.live[job.id] = job
        self._queue.push(self._request(job))
        self._new_demand = True
        log.info(
            "job %s queued: %s v%d for %s on %s%s", job.id, job.function, job.version,
            job.caller, job.sku, _retry_note(job),
            extra={"event": "job_queued", "job_id": job.id, "caller": job.caller,
                   "pool": job.sku, "function": job.function, "retries": job.retries},
        )  # fmt: skip
        self.wake()

    def queued(self) -> list[Job]:
        """The queued jobs in dispatch order (a new list: O(queue))."""
        live = self.live
        return [live[req.job_id] for req in self._queue]

    def queue_depth(self) -> int:
        return len(self._queue)

    async def wait(self, job_id: str, timeout: float) -> Job | None:
        """The job once terminal, or None if ``timeout`` passes first."""
        job = self.live.get(job_id)
        if job is None:
            return None
        fut: asyncio.Future[Job] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(job_id, []).append(fut)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except (TimeoutError, WaitReleased):
            return None
        finally:
            waiters = self._waiters.get(job_id)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[job_id]

    def _resolve(self, job: Job) -> None:
        end = job.finished or self.clock()
        log.info(
            "job %s ended %s%s %.3f s after submission%s", job.id, job.state,
            f" {job.error.get('class')}" if job.error else "", end - job.submitted,
            f" (ran {end - job.started:.3f} s)" if job.started is not None else "",
            extra={"event": "job_ended", "job_id": job.id, "caller": job.caller,
                   "pool": job.sku, "state": str(job.state),
                   "error_class": (job.error or {}).get("class")},
        )  # fmt: skip
        self.counters[f"jobs_{str(job.state).lower()}"] += 1
        self.telemetry.job_ended(job.sku, str(job.state))
        self.live.pop(job.id, None)
        for fut in self._waiters.pop(job.id, []):
            if not fut.done():
                fut.set_result(job)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    # -- the loop -----------------------------------------------------------------------
    async def run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.tick_s)
            self._wake.clear()
            if self._stopping:  # ``halt`` woke it: start nothing more
                break
            try:
                self.dispatch_pass()
            except Exception:
                log.exception("dispatch pass failed")

    def dispatch_pass(self) -> None:
        now = self.clock()
        reconcile = self._replan or now >= self._next_reconcile
        new_demand, self._new_demand = self._new_demand, False
        result = dispatch_pass(self.tracker, self._queue, now, reconcile, new_demand)
        if reconcile or (new_demand and result.waiting):
            self._replan = False
            self._next_reconcile = now + self.reconcile_s
        for lease in result.leases:  # the pass took them off the queue
            self.counters[f"path_{lease.path}"] += 1
            self.spawn(self._start(self.live[lease.job_id], lease))
        if result.actions:
            wanted = result.waiting.skus()
            for action in result.actions:
                self.pods.apply(action, demand=wanted)

    def _request(self, job: Job) -> ClaimRequest:
        spec = self.specs.get((job.function, job.version))
        return ClaimRequest(
            job_id=job.id,
            caller=job.caller,
            sku=job.sku,
            lease_tag=job.lease_tag,
            queue=job.queue,
            pods=job.pods_needed,
            single_use=job.single_use or (spec is not None and spec.single_use),
            queued_at=job.submitted,
            priority=job.priority,
        )

    # -- one job ------------------------------------------------------------------------
    async def _start(self, job: Job, lease: Lease) -> None:
        now = self.clock()
        spec = self.specs.get((job.function, job.version))
        if spec is None:
            spec = await self.functions(job.function, job.version)
        revision = job.revision
        # Until the RUNNING commit lands, readers see the job as the store has it (queued): a
        # crash in between re-queues it, and it read RUNNING, then QUEUED again.
        self.starting[job.id] = dataclasses.replace(job, attempts=list(job.attempts))
        attempt = Attempt(id=job.next_attempt_id(), pods=list(lease.pods), started=now)
        job.move_to(JobState.RUNNING)
        job.attempts.append(attempt)
        job.acquisition = {"path": lease.path, "reason": lease.reason}
        if job.started is None:
            job.started = now
        try:
            if spec is None:
                raise LookupError(f"function {job.function} v{job.version} is gone")
            await self.store.update(job, revision)
        except Exception as exc:
            # No user code ran: give the pods back exactly as they were, and the claim's
            # count (taken when the claim was made; left in place, a job re-queued by a store
            # outage would count twice).
            del self.starting[job.id]
            self.tracker.unclaim(job.id, self.clock())
            self.counters[f"path_{lease.path}"] -= 1
            job.attempts.pop()
            job.undo_to(JobState.QUEUED)
            if isinstance(exc, LookupError):
                await self._fail_before_start(job, revision, exc)
            else:
                if not isinstance(exc, StaleRevision):
                    log.warning("RUNNING commit of job %s failed (%r); re-queued", job.id, exc)
                    await asyncio.sleep(0.1)  # a store outage: do not spin
                await self._reload(job)
            self.wake()
            return
        del self.starting[job.id]
        self.tracker.launched(job.id, self.clock())
        self.telemetry.acquired(
            job.sku, lease.path, lease.reason, now - job.submitted if not job.retries else None
        )
        log.info(
            "job %s started: attempt %s on %s, path %s%s", job.id, attempt.id,
            ",".join(lease.pods), lease.path, f" ({lease.reason})" if lease.reason else "",
            extra={"event": "attempt_started", "job_id": job.id, "attempt_id": attempt.id,
                   "caller": job.caller, "pool": job.sku, "pods": list(lease.pods),
                   "path": lease.path, "reason": lease.reason},
        )  # fmt: skip
        owner_unrecorded = None
        first_use = lease.path not in ("warm", "recycled")
        retire = {"single_use": "single_use", "recycled": "session_boundary"}.get(lease.path)
        if first_use or retire is not None:
            # First use of these pods: persist the owner before any user code runs, so a
            # restarted broker can never hand a used pod to another caller (paper A.1 step 4);
            # and whether the pod must retire after this job, so it never serves again.
            try:
                if first_use:
                    await self.pods.persist_owner(
                        lease.pods, job.caller, job.lease_tag, job.queue, retire
                    )
                else:
                    await self.pods.persist_owner(lease.pods, None, None, None, retire)
            except Exception as exc:  # then no user code runs on them: deleted, job retried
                owner_unrecorded = Outcome.pod_lost(
                    list(lease.pods), f"the pods' owner could not be recorded: {exc!r}"
                )
        if owner_unrecorded is not None:
            outcome = owner_unrecorded
        elif job.id in self._cancel_requested:
            outcome = Outcome(
                state=AttemptState.CANCELLED,
                finished=self.clock(),
                error={"class": str(ErrorClass.CANCELLED), "message": "cancelled before launch"},
            )
        else:
            try:
                outcome = await self.executor.run(job, spec, list(lease.pods), attempt.id)
            except Exception as exc:  # a broker bug must not strand the job on leased pods
                log.exception("attempt %s of job %s failed in the broker", attempt.id, job.id)
                outcome = Outcome(
                    state=AttemptState.FAILED,
                    error={"class": str(ErrorClass.INTERNAL), "message": f"broker error: {exc!r}"},
                    finished=self.clock(),
                    lost_pods=list(lease.pods),  # their state is unknown: delete, never reuse
                )
        await self.finish(job, lease.pods, outcome)

    async def _fail_before_start(self, job: Job, revision: int, exc: Exception) -> None:
        """Fail a job whose function is gone, ``NotFound``, recorded before anyone is
        answered: the store is retried as for an outcome (``_record_outcome``), and readers
        see the job as the store has it (queued) meanwhile. If the broker stops first the job
        stays queued in the store, and the restarted broker fails it again."""
        self.finishing[job.id] = dataclasses.replace(job, attempts=list(job.attempts))
        job.move_to(JobState.FAILED)
        job.error = {"class": str(ErrorClass.NOT_FOUND), "message": str(exc)}
        job.finished = self.clock()
        try:
            recorded = await self._record_outcome(job, revision, None)
        finally:
            del self.finishing[job.id]
        if recorded is not None:
            self._resolve(job)

    async def _reload(self, job: Job) -> None:
        """Queue the job again as the store has it (after a failed RUNNING commit).

        If the commit did land (the error came after it), the row says RUNNING although
        nothing was launched: move it back to QUEUED first, so no user code ran unrecorded.
        """
        try:
            fresh = await self.store.get_job(job.id)
            if fresh is not None and fresh.state is JobState.RUNNING:
                fresh.move_to(JobState.QUEUED)  # the retry edge: no attempt was launched
                await self.store.update(fresh, fresh.revision)
        except Exception:
            log.exception("could not reload job %s; keeping it queued in memory", job.id)
            fresh = job
        if fresh is None or fresh.state in TERMINAL_JOB_STATES:
            self._resolve(fresh or job)
        else:
            self.live[job.id] = fresh
            self._queue.push(self._request(fresh))

    async def finish(
        self,
        job: Job,
        pods: tuple[str, ...] | list[str],
        outcome: Outcome,
        cancel_may_be_lost: bool = False,
    ) -> None:
        """Record the attempt's outcome durably, answer waiters (a gang's after the next
        step), then reset, release and acknowledge at the agent. A caller's next step never
        finds its own pod still resetting: its claim waits for the reset.

        An attempt the agent reports cancelled when this broker asked no cancel of it is the
        pod failing under the job (``PodLost``), unless ``cancel_may_be_lost`` (recovery: a
        caller's cancel may have reached the agent from the broker before this one)."""
        # Until the outcome is durable, readers see the job as the store has it (RUNNING).
        self.finishing[job.id] = dataclasses.replace(
            job, attempts=[dataclasses.replace(a) for a in job.attempts]
        )
        attempt = job.attempts[-1]
        if outcome.first_instruction is not None:
            self.telemetry.first_instruction(
                job.sku,
                (job.acquisition or {}).get("path") or "unknown",
                outcome.first_instruction - job.submitted
                if job.first_instruction is None
                else None,
                outcome.first_instruction - attempt.started if attempt.started else None,
            )
        attempt.exit_code = outcome.exit_code
        attempt.started = outcome.started or attempt.started
        attempt.finished = outcome.finished or self.clock()
        attempt.error = outcome.error
        error_class = (outcome.error or {}).get("class")
        revision = job.revision
        cancelled = job.id in self._cancel_requested or (
            cancel_may_be_lost and outcome.state is AttemptState.CANCELLED
        )
        if outcome.state is AttemptState.CANCELLED and not cancelled:
            # Nobody asked: the agent ended the attempt on its own (a reset or a shutdown
            # that was not ours, as on a full disk): the pod failing under the job, which
            # must not read CANCELLED to the caller.
            message = (outcome.error or {}).get("message", "")
            outcome = Outcome.pod_lost(
                list(outcome.lost_pods or pods), f"the pod's agent ended the attempt: {message}"
            )
            attempt.error = outcome.error
            error_class = str(ErrorClass.POD_LOST)
        ran_user_code = None if outcome.lost_pods else outcome.first_instruction is not None
        retry = (
            not cancelled
            and outcome.state is not AttemptState.SUCCEEDED
            and decide(
                error_class,
                ran_user_code=ran_user_code,
                retries=job.retries,
                max_retries=job.max_retries,
            ).retry
        )
        if outcome.first_instruction is not None and job.first_instruction is None:
            job.first_instruction = outcome.first_instruction
        if outcome.exit_code is not None:
            job.exit_code = outcome.exit_code
        if retry:
            job.move_to(JobState.QUEUED)
            job.retries += 1
        else:
            job.move_to(
                JobState.SUCCEEDED
                if outcome.state is AttemptState.SUCCEEDED
                else JobState.CANCELLED
                if cancelled
                else JobState.FAILED
            )
            job.output = outcome.output
            job.error = outcome.error
            if cancelled and (job.error or {}).get("class") != str(ErrorClass.CANCELLED):
                # The caller's cancel wins over what the attempt ended with (a PodLost of a
                # pod killed under it, say), which stays on the attempt's own record.
                job.error = {"class": str(ErrorClass.CANCELLED), "message": "cancelled"}
            job.finished = attempt.finished
        recorded = await self._record_outcome(job, revision, attempt)
        if recorded is None:
            return  # the broker is stopping: the agent keeps the result for recovery
        del self.finishing[job.id]
        if recorded is Recorded.TOO_LARGE:
            retry = False
        # The outcome is durable, so a one-pod job is answered now, before its reset: its
        # session's next claim waits for this pod (``Tracker.resetting``) rather than take
        # another, and a crash from here on finds the attempt at the agent and finalizes it
        # without running it again (paper A.1). A gang is answered after its reset: it is
        # claimed whole, and while its pods reset would take others.
        answered = not retry and len(pods) == 1
        if answered:
            self.tracker.resetting(job.id)
            self.recycler.answered(job.id)
            self._cancel_requested.discard(job.id)
            self._resolve(job)
        try:  # only now may the agent forget the result
            clean = await self.recycler.reset(list(pods), outcome.lost_pods)
            retired = self.recycler.release(job.id, clean)
            self.recycler.archive(job.id, list(pods), attempt.id, outcome.lost_pods, retired)
        finally:  # a reset that raised must not leave the session waiting for its pod
            self.tracker.reset_over(job.id)
            self.recycler.archive_begun(job.id)
        if retry:
            self.enqueue(job)
        elif not answered:
            self._cancel_requested.discard(job.id)
            self._resolve(job)

    async def _record_outcome(
        self, job: Job, revision: int, attempt: Attempt | None
    ) -> Recorded | None:
        """Commit the attempt's outcome before anything acts on it (the reset that makes the
        agent forget the result, the caller's answer): ``OUTCOME``, or ``TOO_LARGE`` when
        the store could not hold the record (an output near the body cap on MySQL's default
        ``max_allowed_packet``), which is then recorded as that failure instead, final.

        A store that fails otherwise (down, connection lost) is retried with backoff until it
        answers; the job's pods stay as they are meanwhile. If the broker stops first: None,
        and the outcome waits at the agent for the restarted broker's recovery. A write the
        store refuses cleanly (a stale revision) is logged and passed over, as it changes
        nothing a retry could."""
        delay = 0.1
        status = Recorded.OUTCOME
        while True:
            try:
                await self.store.update(job, revision)
                return status
            except TooLarge as exc:
                if status is Recorded.TOO_LARGE:  # even the short failure does not fit: give up
                    log.error("could not record job %s: %s", job.id, exc.message)
                    return status
                log.warning("job %s: %s", job.id, exc.message)
                durable = self.finishing.get(job.id)
                job.undo_to(durable.state if durable is not None else JobState.RUNNING)
                job.move_to(JobState.FAILED)
                job.output = None
                job.error = exc.to_json()
                if attempt is not None:
                    attempt.error = job.error
                job.finished = job.finished or self.clock()
                status = Recorded.TOO_LARGE
            except (FirepoolError, IllegalTransition):
                log.exception("could not record the outcome of job %s", job.id)
                return status
            except Exception as exc:
                if self._stopping:
                    log.error("job %s: outcome not recorded (%r) before the broker stopped; "
                              "the pod keeps it for recovery", job.id, exc)  # fmt: skip
                    return None
                log.warning("could not record the outcome of job %s (%r); retrying in %.1f s",
                            job.id, exc, delay)  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(2 * delay, _RECORD_RETRY_MAX_S)

    async def cancel(self, job: Job) -> Job:
        """Cancel a queued or running job; terminal jobs are returned unchanged, and so is a
        job whose attempt already ended (its outcome being recorded: too late to cancel)."""
        if job.state in TERMINAL_JOB_STATES:
            return job
        if job.id in self.finishing:
            return self.finishing[job.id]
        live = self.live.get(job.id, job)
        self._cancel_requested.add(job.id)
        if self._queue.remove(job.id) is not None:
            revision = live.revision
            live.move_to(JobState.CANCELLED)
            live.error = {"class": str(ErrorClass.CANCELLED), "message": "cancelled by caller"}
            live.finished = self.clock()
            try:
                await self.store.update(live, revision)
            except Exception:
                # Not recorded: the job stays queued exactly as it was.
                live.undo_to(JobState.QUEUED)
                live.error, live.finished = None, None
                self._cancel_requested.discard(job.id)
                self.enqueue(live)
                raise
            self._cancel_requested.discard(job.id)
            self._resolve(live)
            return live
        if live.state is JobState.RUNNING and live.attempts:
            attempt = live.attempts[-1]
            await self.executor.cancel(attempt.pods, attempt.id, abandon=True)
        # Still starting: cancelled before launch (``_start`` sees the request); answered as
        # the store has it meanwhile.
        return self.starting.get(live.id, live)

    def release_waiters(self) -> None:
        """Answer every ``wait`` now, as if its timeout had passed (the job goes on): at
        shutdown, before the server cancels the requests still waiting on their jobs."""
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_exception(WaitReleased())

    def halt(self) -> None:
        """Dispatch nothing more (attempts under way finish, as the store allows)."""
        self._stopping = True
        self.wake()

    async def stop(self, drain_s: float) -> None:
        self.halt()
        queued = {req.job_id for req in self._queue}
        running = [job_id for job_id in self.live if job_id not in queued]
        log.info(
            "stopping: %d running job(s) get up to %.0f s to end; %d queued stay in the store",
            len(running), drain_s, len(queued),
        )  # fmt: skip
        await self._tasks.stop(drain_s)
        queued = {req.job_id for req in self._queue}  # with those whose attempt ended for a retry
        left = [job_id for job_id in running if job_id in self.live and job_id not in queued]
        log.info(
            "stopped: %d of %d running job(s) ended within the drain, %d still running; "
            "%d queued", len(running) - len(left), len(running), len(left), len(queued),
        )  # fmt: skip
