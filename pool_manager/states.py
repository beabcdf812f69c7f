"""Pod and job lifecycles as data.

One ``TRANSITIONS`` table per lifecycle, one ``transition`` function that rejects illegal moves
and appends ``(now, old, new, reason)`` to the object's history, so "why is this here?" always
has an answer. Pure code: no I/O, time is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Protocol, TypeVar


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


class HasLifecycle(Protocol[S]):
    state: S
    history: list[tuple[float, str, str, str]]


#: Pods keep only their last few transitions: the tracker holds 100,000 of them and the
#: claim path must not grow memory. Jobs keep their whole (short) history.
POD_HISTORY_LIMIT = 3


def transition(
    obj: HasLifecycle[S],
    new: S,
    reason: str,
    now: float,
    table: Mapping[S, frozenset[S]],
    limit: int | None = None,
) -> None:
    """Move ``obj`` to ``new`` if the table allows it, recording why and when.

    ``limit`` bounds the history to its last ``limit`` entries. States are ``StrEnum``
    members, so they are stored as-is (they are ``str``) without copying.
    """
    old = obj.state
    if new not in table[old]:
        raise IllegalTransition(f"{old} -> {new} is not allowed ({reason})")
    obj.state = new
    history = obj.history
    history.append((now, old, new, reason))
    if limit is not None and len(history) > limit:
        del history[0]
