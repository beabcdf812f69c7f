"""Runs one attempt on the pods of a lease through their agents (paper A.1 step 5, A.2).

For a single pod the attempt is one request that returns when the job ends (``wait: true``);
a gang starts every rank first, then waits for all of them, and rank 0's result is the job's
unless another rank failed first (then that rank's error is the job's). Rank and rendezvous
variables go in ``system_env``, which the agent applies after the user's filtered env, so a
user cannot override them: every rank gets ``MASTER_ADDR``, rank 0's pod address
(``endpoint_host`` of its agent endpoint: its pod IP on a cluster, 127.0.0.1 locally), and
``MASTER_PORT``, a port rank 0's pod owns (the backend's declared ``rendezvous_port``, or a
free port of that address when the backend has none), with ``RANK``/``NODE_RANK``/
``GROUP_RANK`` (one rank per pod), ``WORLD_SIZE``, ``LOCAL_RANK`` 0 and ``LOCAL_WORLD_SIZE`` 1.
An agent that stops answering makes the attempt ``PodLost`` (retryable); everything else is
the function's own outcome. A caller's cancel that an agent does not answer (a job can stop
its own agent) abandons the attempt: it ends ``cancelled`` at once and its pods are deleted,
never waited for nor reused.

Concurrency: event-loop only; ``_abandon`` holds one event per attempt in flight in ``run``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.agent_client import AgentClient, AgentUnreachable
from broker.jobs import Job, JsonText
from functions.errors import ErrorClass
from functions.nesting import MAX_NESTING, json_within
from functions.spec import MAX_TIMEOUT_S, FunctionSpec
from pod_runtime.deps import INSTALL_TIMEOUT_S
from pod_runtime.protocol import AttemptSpec, AttemptState, BlobRef, encode_spec
from pool_manager.backends.base import endpoint_host

GRACE_S = 30.0


def attempt_deadline_s(job_timeout_s: float | None, spec: FunctionSpec | None) -> float:
    """How long the broker waits for an attempt's outcome before it counts the pod lost: the
    job's own ``timeout_s``, else its function's (the agent enforces it from the job's
    process), the grace, and for a function with requirements the agent's install budget,
    which comes before the job's clock starts, so a slow install (a hanging index) ends in the
    agent's own ``DependencyInstallFailed``, not cut at ``timeout_s`` plus the grace as a
    ``PodLost`` that is retried on new pods.
    ``spec`` None (a function gone, after a restart): the longest any may take."""
    if spec is None:
        return (job_timeout_s or MAX_TIMEOUT_S) + GRACE_S + INSTALL_TIMEOUT_S
    install = INSTALL_TIMEOUT_S if spec.requirements_digest else 0.0
    return (job_timeout_s or spec.timeout_s) + GRACE_S + install


@dataclass(slots=True)
class Outcome:
    """What one attempt ended with."""

    state: AttemptState
    """How the attempt ended: succeeded, failed or cancelled."""
    output: Any = None
    error: dict[str, str] | None = None
    exit_code: int | None = None
    started: float | None = None
    first_instruction: float | None = None
    finished: float | None = None
    lost_pods: list[str] = field(default_factory=list)

    @classmethod
    def from_agent(cls, body: Mapping[str, Any]) -> Outcome:
        """The agent's result. Its output is kept as JSON text (``JsonText``), serialized
        once here and never built again: the store keeps that text and every answer embeds
        it. An output that nests past the limit, which only a job that forged its agent's
        answer can send, fails the attempt as ``FunctionError``."""
        try:
            state = AttemptState(str(body.get("state")))
        except ValueError:  # an agent that answers no state it may end in: failed
            state = AttemptState.FAILED
        output, error = body.get("output"), bounded_error(body.get("error"))
        if output is not None:
            try:
                output = JsonText(json_within(output).decode())
            except ValueError as exc:
                state, output = AttemptState.FAILED, None
                message = f"the pod answered an output past {MAX_NESTING} levels: {exc}"
                error = {"class": str(ErrorClass.FUNCTION_ERROR), "message": message}
        return cls(
            state=state,
            output=output,
            error=error,
            exit_code=body.get("exit_code"),
            started=body.get("started"),
            first_instruction=body.get("first_instruction"),
            finished=body.get("finished"),
        )

    @classmethod
    def refused(cls, pod: str, body: Any) -> Outcome:
        """The agent answered 400: the attempt spec itself is bad (a broker-side check it
        passed, the agent's did not). The pod ran nothing and is sound: fail the job with the
        agent's typed error, as a request error (never retried), and keep the pod."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict) or "class" not in error:
            error = {"class": str(ErrorClass.INVALID_REQUEST), "message": str(body)}
        message = f"pod {pod} refused the attempt: {error.get('message', '')}"
        kept = bounded_error({**error, "message": message})
        return cls(state=AttemptState.FAILED, error=kept, finished=time.time())

    @classmethod
    def pod_lost(cls, pods: list[str], message: str) -> Outcome:
        return cls(
            state=AttemptState.FAILED,
            error=bounded_error({"class": str(ErrorClass.POD_LOST), "message": message}),
            finished=time.time(),
            lost_pods=pods,
        )


ERROR_FIELD_CHARS = 8192
"""Longest text kept in one field of an attempt's error (the agent sends at most 8,000
characters of message and of traceback; a forged answer could send megabytes, which every
read and listing of the job would then carry twice: job and attempt)."""
ERROR_FIELDS = 6
"""Most fields kept in an attempt's error (``class``, ``message``, ``type``, ``traceback``...)."""


def bounded_error(error: object) -> dict[str, str] | None:
    """The agent's error as the broker keeps it: string fields, each at most
    ``ERROR_FIELD_CHARS`` (the rest counted), at most ``ERROR_FIELDS`` of them."""
    if error is None:
        return None
    if not isinstance(error, dict):
        error = {"class": str(ErrorClass.INTERNAL), "message": str(error)}
    kept: dict[str, str] = {}
    for key, value in list(error.items())[:ERROR_FIELDS]:
        text = value if isinstance(value, str) else str(value)
        if len(text) > ERROR_FIELD_CHARS:
            cut = len(text) - ERROR_FIELD_CHARS
            text = f"{text[:ERROR_FIELD_CHARS]} ... [{cut} more characters]"
        kept[str(key)[:64]] = text
    return kept


def _free_port(host: str) -> int:
    """A port free on ``host`` now (a local gang's rendezvous: its ranks share this host)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Rendezvous:
    """Where a gang's ranks meet: rank 0's pod address and a port that pod owns."""

    host: str
    port: int


def rank_env(rank: int, world: int, meet: Rendezvous) -> dict[str, str]:
    """The system env of rank ``rank`` of a ``world``-pod gang (one rank per pod: the pod is
    torchrun's node, so ``NODE_RANK`` and ``GROUP_RANK`` are the rank too)."""
    return {
        "MASTER_ADDR": meet.host,
        "MASTER_PORT": str(meet.port),
        "RANK": str(rank),
        "NODE_RANK": str(rank),
        "GROUP_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
    }


class Executor:
    def __init__(
        self,
        agents: AgentClient,
        endpoints: Mapping[str, str],
        package_url: Callable[[str], str],
        rendezvous_port: int | None = None,
    ) -> None:
        """``rendezvous_port``: the backend's (``PodBackend.rendezvous_port``); None picks a
        free port of rank 0's address for each gang attempt."""
        self.agents = agents
        self.endpoints = endpoints
        self.package_url = package_url
        self.rendezvous_port = rendezvous_port
        self._abandon: dict[str, asyncio.Event] = {}

    def attempt_spec(
        self,
        job: Job,
        spec: FunctionSpec,
        attempt_id: str,
        rank: int,
        world: int,
        meet: Rendezvous | None,
    ) -> AttemptSpec:
        """What rank ``rank`` of ``world`` runs: the job's input, the function's code by
        signed URL, its env, and the system env (caller, ids, rendezvous) that wins over it."""
        system_env = {
            "FIREPOOL_CALLER": job.caller,
            "FIREPOOL_JOB_ID": job.id,
            "FIREPOOL_ATTEMPT_ID": attempt_id,
            "FIREPOOL_FUNCTION": f"{spec.name}:{spec.version}",
        }
        if world > 1 and meet is not None:
            system_env.update(rank_env(rank, world, meet))
        requirements = None
        if spec.requirements_digest is not None:
            requirements = BlobRef(
                url=self.package_url(spec.requirements_digest), digest=spec.requirements_digest
            )
        return AttemptSpec(
            attempt_id=attempt_id,
            package=BlobRef(url=self.package_url(spec.package_digest), digest=spec.package_digest),
            entrypoint=spec.entrypoint,
            command=spec.command,
            input=job.input,
            env=dict(spec.env),
            system_env=system_env,
            requirements=requirements,
            timeout_s=job.timeout_s or spec.timeout_s,
            wait=world == 1,
        )

    async def run(self, job: Job, spec: FunctionSpec, pods: list[str], attempt_id: str) -> Outcome:
        timeout = attempt_deadline_s(job.timeout_s, spec)
        world = len(pods)
        meet = self.rendezvous(pods[0]) if world > 1 else None
        specs = [self.attempt_spec(job, spec, attempt_id, r, world, meet) for r in range(world)]
        if world == 1:
            work = self._run_one(pods[0], specs[0], timeout)
        else:
            work = self._run_gang(pods, specs, timeout)
        return await self._unless_abandoned(attempt_id, pods, work)

    def rendezvous(self, rank0: str) -> Rendezvous:
        """Where the gang whose rank 0 runs on pod ``rank0`` meets: that pod's address, and
        the backend's declared port or a port free there now."""
        host = endpoint_host(self.endpoints.get(rank0, ""))
        return Rendezvous(host, self.rendezvous_port or _free_port(host))

    async def reattach(self, pods: list[str], attempt_id: str, timeout: float) -> Outcome:
        """Wait for an attempt a restarted broker found on its pods, every rank of a gang
        (``wait`` answers at once for a rank that already ended), unless a caller's cancel
        abandons it first, as ``run`` does. The outcome is what ``run`` would have given: a
        rank that failed, while the broker was down or after, fails the gang with its error
        and the other ranks are stopped."""
        if len(pods) == 1:
            work = self.wait(pods[0], attempt_id, timeout)
        else:
            work = self._wait_gang(pods, attempt_id, timeout)
        return await self._unless_abandoned(attempt_id, pods, work)

    async def _unless_abandoned(
        self, attempt_id: str, pods: list[str], work: Coroutine[Any, Any, Outcome]
    ) -> Outcome:
        """``work``'s outcome, unless ``cancel`` abandons the attempt first."""
        abandon = self._abandon[attempt_id] = asyncio.Event()
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(abandon.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            self._abandon.pop(attempt_id, None)
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        message = "cancelled by caller; the pod's agent did not answer, so its pods are deleted"
        return Outcome(
            state=AttemptState.CANCELLED,
            error={"class": str(ErrorClass.CANCELLED), "message": message},
            finished=time.time(),
            lost_pods=list(pods),
        )

    async def _run_one(self, pod: str, spec: AttemptSpec, timeout: float) -> Outcome:
        endpoint = self.endpoints.get(pod)
        if endpoint is None:
            return Outcome.pod_lost([pod], f"pod {pod} has no endpoint")
        try:
            status, body = await self.agents.start(endpoint, encode_spec(spec), timeout)
        except AgentUnreachable as exc:
            return Outcome.pod_lost([pod], f"the agent of pod {pod} did not answer: {exc}")
        if status == 400:
            return Outcome.refused(pod, body)
        if status != 200:
            return Outcome.pod_lost([pod], f"agent refused the attempt: HTTP {status} {body}")
        return Outcome.from_agent(body)

    async def _run_gang(self, pods: list[str], specs: list[AttemptSpec], timeout: float) -> Outcome:
        started: list[str] = []
        for pod, spec in zip(pods, specs, strict=True):
            endpoint = self.endpoints.get(pod)
            try:
                if endpoint is None:
                    raise AgentUnreachable(f"pod {pod} has no endpoint")
                status, body = await self.agents.start(endpoint, encode_spec(spec), 10.0)
                if status == 400:  # a bad spec, the same for every rank: nothing is lost
                    await self.cancel(started, spec.attempt_id)
                    return Outcome.refused(pod, body)
                if status not in (200, 202):
                    raise AgentUnreachable(f"agent refused: HTTP {status} {body}")
                started.append(pod)
            except AgentUnreachable as exc:
                await self.cancel(started, spec.attempt_id)
                return Outcome.pod_lost([pod], f"launch failed on {pod}: {exc}")
        return await self._wait_gang(pods, specs[0].attempt_id, timeout)

    async def _wait_gang(self, pods: list[str], attempt_id: str, timeout: float) -> Outcome:
        """Every rank's outcome of a launched gang attempt, combined: a lost rank pod makes
        it ``PodLost``; else the first rank to fail gives its error (the others are cancelled
        then); else rank 0's."""
        waits = {asyncio.ensure_future(self.wait(p, attempt_id, timeout)): p for p in pods}
        results: dict[str, Outcome] = {}
        failed: Outcome | None = None  # the first rank to fail: the gang's outcome
        pending = set(waits)
        try:
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    result = results[waits[task]] = task.result()
                    if failed is None and (
                        result.lost_pods or result.state is not AttemptState.SUCCEEDED
                    ):
                        # One rank failed: the others would wait on it (a collective) or
                        # run on for nothing; they are stopped at once, not at their own
                        # end (rank 0 could run 20 s after rank 1 failed at 0 s).
                        failed = result
                        if pending:
                            await self.cancel([waits[t] for t in pending], attempt_id)
        finally:
            for task in pending:  # cancelled from outside (an abandoned attempt)
                task.cancel()
        lost = [p for p in pods if results[p].lost_pods]
        if lost:
            await self.cancel(pods, attempt_id)
            return Outcome.pod_lost(lost, f"rank pods lost: {lost}")
        rank0 = results[pods[0]]
        if failed is not None and failed is not rank0:
            rank0.state, rank0.error = failed.state, failed.error
            rank0.exit_code = failed.exit_code
        return rank0

    async def wait(self, pod: str, attempt_id: str, timeout: float) -> Outcome:
        """Wait for an attempt already running on ``pod`` (gang ranks, re-attach on restart)."""
        endpoint = self.endpoints.get(pod)
        if endpoint is None:
            return Outcome.pod_lost([pod], f"pod {pod} has no endpoint")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                body = await self.agents.result(endpoint, attempt_id, wait_s=20.0)
            except AgentUnreachable as exc:
                return Outcome.pod_lost([pod], f"the agent of pod {pod} did not answer: {exc}")
            if body is None:
                return Outcome.pod_lost([pod], f"agent on {pod} does not know {attempt_id}")
            if body.get("state") != AttemptState.RUNNING:
                return Outcome.from_agent(body)
            if loop.time() > deadline:
                return Outcome.pod_lost([pod], f"{attempt_id} outlived its timeout")

    async def cancel(self, pods: list[str], attempt_id: str, abandon: bool = False) -> None:
        """Ask each pod's agent to cancel ``attempt_id``. ``abandon`` (a caller's cancel):
        if an agent does not answer, end the attempt now as cancelled, its pods lost."""
        silent = False
        for pod in pods:
            endpoint = self.endpoints.get(pod)
            if endpoint is not None:
                try:
                    await self.agents.cancel(endpoint, attempt_id)
                except AgentUnreachable:
                    silent = True
        if abandon and silent and attempt_id in self._abandon:
            self._abandon[attempt_id].set()
