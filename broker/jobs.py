"""The job record: one invocation (the intent) and its attempts (each execution).

A ``Job`` is mutated only by its owner task on the event loop and persisted through the job
store with a compare-and-set on ``revision``. ``to_public`` is the JSON a caller sees.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from pool_manager.states import JOB_TRANSITIONS, JOB_UNDOS, IllegalTransition, JobState


@dataclass(slots=True)
class Attempt:
    """One execution of a job, named ``<job-id>:<n>`` at the pod agent."""

    id: str
    pods: list[str]
    exit_code: int | None = None
    started: float | None = None
    finished: float | None = None
    error: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "pods": self.pods,
            "started": self.started,
            "finished": self.finished,
        }
        if self.exit_code is not None:
            body["exit_code"] = self.exit_code
        if self.error is not None:
            body["error"] = self.error
        return body

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Attempt:
        return cls(
            id=data["id"],
            pods=list(data["pods"]),
            exit_code=data.get("exit_code"),
            started=data.get("started"),
            finished=data.get("finished"),
            error=data.get("error"),
        )


@dataclass(slots=True)
class Job:
    """A job and everything a caller may ask about it.

    Invariants: ``revision`` increases by one on every durable change; ``attempts[-1]`` is the
    current attempt while RUNNING; ``exit_code`` is absent (None) until some process exited.
    """

    id: str
    function: str
    version: int
    caller: str
    sku: str
    input: Any
    state: JobState = JobState.QUEUED
    revision: int = 0
    lease_tag: str | None = None
    queue: str = "default"
    priority: int = 0
    timeout_s: float | None = None
    """Seconds each attempt may run: the call's, else its function version's (set at submit)."""
    max_retries: int = 0
    pods_needed: int = 1
    output: Any = None
    """The function's return value. From an agent or the store it is the value's JSON text,
    a ``JsonText`` (``output_value`` builds it): the broker stores and answers it without
    building it."""
    error: dict[str, str] | None = None
    exit_code: int | None = None
    retries: int = 0
    attempts: list[Attempt] = field(default_factory=list)
    acquisition: dict[str, str | None] | None = None
    submitted: float = 0.0
    started: float | None = None
    first_instruction: float | None = None
    finished: float | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    output_expired: bool = False
    """The result-retention period passed: the output (and logs) are gone."""
    single_use: bool = False
    """Run on a fresh pod, retired after the job: the call asked, or its version does."""
    output_omitted: bool = False
    """In a listing only: the output is left out to keep the listing's size bounded
    (``JobStore.list_jobs``); the job's own record has it."""

    def move_to(self, new: JobState) -> None:
        """Move to ``new``; ``IllegalTransition`` for a move ``JOB_TRANSITIONS`` forbids.
        Every change of a job's state outside its construction goes through here or
        ``undo_to``; the store's compare-and-set checks the same table durably."""
        if new not in JOB_TRANSITIONS[self.state]:
            raise IllegalTransition(f"job {self.id}: {self.state} -> {new}")
        self.state = new

    def undo_to(self, durable: JobState) -> None:
        """Undo a move the store did not record, back to ``durable``, the state its last
        durable record has; ``IllegalTransition`` for an undo ``JOB_UNDOS`` does not list."""
        if self.state is durable:
            return
        if durable not in JOB_UNDOS[self.state]:
            raise IllegalTransition(f"job {self.id}: undo {self.state} -> {durable}")
        self.state = durable

    def next_attempt_id(self) -> str:
        """Attempt ids are ``<job-id>:<n>``, n counting every launch, so a re-queued attempt
        can never be confused with an earlier one at the agent."""
        return f"{self.id}:{len(self.attempts)}"

    def to_public(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "function": self.function,
            "version": self.version,
            "caller": self.caller,
            "sku": self.sku,
            "state": str(self.state),
            "lease_tag": self.lease_tag,
            "queue": self.queue,
            "priority": self.priority,
            "timeout_s": self.timeout_s,  # effective: the call's, else its function's
            "output": self.output.fragment() if isinstance(self.output, JsonText) else self.output,
            "output_expired": self.output_expired,
            "error": self.error,
            "retries": self.retries,
            "attempts": [a.to_json() for a in self.attempts],
            "acquisition": self.acquisition,
            "timings": {
                "submitted": self.submitted,
                "started": self.started,
                "first_instruction": self.first_instruction,
                "finished": self.finished,
            },
        }
        if self.exit_code is not None:
            body["exit_code"] = self.exit_code
        if self.output_omitted:
            body["output_omitted"] = True
        if self.single_use:
            body["single_use"] = True
        return body


@dataclass(frozen=True, slots=True)
class JsonText:
    """A JSON value kept as its text: the broker passes a job's output through (from the
    agent to the store and to callers) without building it (``Job.output``)."""

    text: str

    def value(self) -> Any:
        return orjson.loads(self.text)

    def fragment(self) -> orjson.Fragment:
        """What orjson embeds as it is, unparsed."""
        return orjson.Fragment(self.text)


def output_value(output: Any) -> Any:
    """A job's output as a value: ``Job.output`` kept as JSON text is parsed, else as is."""
    return output.value() if isinstance(output, JsonText) else output
