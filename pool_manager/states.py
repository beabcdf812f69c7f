"""Pod and job lifecycles as data.

One ``TRANSITIONS`` table per lifecycle, one ``transition`` function that rejects illegal moves
and records ``(now, old, new, reason)``: in a job's own ``history``, or for pods in the
tracker's bounded ``TransitionLog``, so "why is this here?" always has an answer. Pure code:
no I/O, time is passed in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from enum import StrEnum
from typing import Protocol, TypeVar, cast


class JobState(StrEnum):
    PENDING = "PENDING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


TERMINAL_JOB_STATES: frozenset[JobState] = frozenset(
    {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED}
)

JOB_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    # accepted and durably recorded; rejected before queueing (e.g. function deleted)
    JobState.PENDING: frozenset({JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    # claimed pods and committed the binding; cancelled or expired while waiting
    JobState.QUEUED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.CANCELLED}),
    # attempt ended; or re-queued for a retry / after restart recovery found no live attempt
    JobState.RUNNING: frozenset(
        {JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.QUEUED}
    ),
    JobState.SUCCEEDED: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}


JOB_UNDOS: Mapping[JobState, frozenset[JobState]] = {
    # A move made in memory and then refused by the store is undone, back to the state the
    # store still has, before the job is handled again; never a move of its own.
    # the RUNNING commit failed: nothing was launched, the job is queued as it was
    JobState.RUNNING: frozenset({JobState.QUEUED}),
    # an outcome (or a retry) the store refused as too large: decided again from RUNNING
    JobState.QUEUED: frozenset({JobState.RUNNING}),
    JobState.SUCCEEDED: frozenset({JobState.RUNNING}),
    # a failure the store refused as too large: from RUNNING, or from QUEUED (a job whose
    # function was gone failed before it started)
    JobState.FAILED: frozenset({JobState.RUNNING, JobState.QUEUED}),
    # a cancel the store did not record: queued as it was; or an outcome as above
    JobState.CANCELLED: frozenset({JobState.QUEUED, JobState.RUNNING}),
    JobState.PENDING: frozenset(),
}
"""The undos the broker takes, per state it leaves: each returns a job to the state its last
durable record has (``Job.undo_to``).

Apart from ``JOB_TRANSITIONS`` because an undo is never written: the store's compare-and-set
derives the states it accepts from ``JOB_TRANSITIONS`` alone, so no undo (SUCCEEDED back to
RUNNING, say) can ever become durable. A named edge rather than a copy of the job put back:
the live ``Job`` object is the one the queue and the waiters hold, so it is undone in place."""


class PodState(StrEnum):
    STARTING = "STARTING"
    IDLE = "IDLE"
    ASSIGNED = "ASSIGNED"
    RUNNING = "RUNNING"
    RESETTING = "RESETTING"
    RETIRING = "RETIRING"
    DELETED = "DELETED"


POD_TRANSITIONS: Mapping[PodState, frozenset[PodState]] = {
    # the agent answered its readiness probe; or the create failed / pod vanished
    PodState.STARTING: frozenset({PodState.IDLE, PodState.RETIRING, PodState.DELETED}),
    # claimed for a job; expired past keep-alive or hold; vanished under us
    PodState.IDLE: frozenset({PodState.ASSIGNED, PodState.RETIRING, PodState.DELETED}),
    # launched; launch or commit failed before user code ran (back to idle, never used)
    PodState.ASSIGNED: frozenset(
        {PodState.RUNNING, PodState.IDLE, PodState.RESETTING, PodState.RETIRING, PodState.DELETED}
    ),
    # the agent reset it and reported the job's processes verified dead (held for its owner);
    # the agent resets it asynchronously; unclean, boundary or single-use -> retire; lost mid-job
    PodState.RUNNING: frozenset(
        {PodState.IDLE, PodState.RESETTING, PodState.RETIRING, PodState.DELETED}
    ),
    # verified clean -> idle (held for its owner); unclean or boundary -> retire
    PodState.RESETTING: frozenset({PodState.IDLE, PodState.RETIRING, PodState.DELETED}),
    # the delete was issued; the backend confirms it gone
    PodState.RETIRING: frozenset({PodState.DELETED}),
    PodState.DELETED: frozenset(),
}


class IllegalTransition(ValueError):
    """A state change that the lifecycle table does not allow."""


S = TypeVar("S", JobState, PodState)


class HasState(Protocol[S]):
    state: S


class HasLifecycle(HasState[S], Protocol[S]):
    history: list[tuple[float, str, str, str]]


class TransitionLog(deque[tuple[float, str, str, str, str]]):
    """A bounded ring of ``(now, subject, old, new, reason)`` shared by many objects.

    Pods keep their history here rather than in a list each: the tracker holds 100,000 pods
    and memory per pod is a budget, while "why is this pod here?" only needs the recent past.
    Recording is one C-level ``deque.append``; looking one subject up scans the ring.
    """

    def __init__(self, maxlen: int = 32768) -> None:
        super().__init__((), maxlen)

    def record(self, now: float, subject: str, old: str, new: str, reason: str) -> None:
        self.append((now, subject, old, new, reason))

    def of(self, subject: str) -> list[tuple[float, str, str, str]]:
        """``subject``'s transitions still in the ring, oldest first."""
        return [(t, old, new, why) for t, s, old, new, why in self if s == subject]


def transition(
    obj: HasState[S],
    new: S,
    reason: str,
    now: float,
    table: Mapping[S, frozenset[S]],
    log: TransitionLog | None = None,
    subject: str = "",
) -> None:
    """Move ``obj`` to ``new`` if the table allows it, recording why and when.

    The record goes to ``log`` under ``subject`` when given (pods), else to ``obj.history``
    (jobs). States are ``StrEnum`` members, so they are stored as-is (they are ``str``).
    """
    old = obj.state
    if new not in table[old]:
        raise IllegalTransition(f"{subject or type(obj).__name__}: {old} -> {new} ({reason})")
    obj.state = new
    if log is not None:
        log.append((now, subject, old, new, reason))
    else:
        cast("HasLifecycle[S]", obj).history.append((now, old, new, reason))
