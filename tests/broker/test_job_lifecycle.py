"""A job's state changes only along JOB_TRANSITIONS (moves) and JOB_UNDOS (undoing a move the
store did not record); anything else raises IllegalTransition."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.jobs import Job
from pool_manager.states import JOB_TRANSITIONS, JOB_UNDOS, IllegalTransition, JobState

states = st.sampled_from(list(JobState))


def make_job(state: JobState) -> Job:
    return Job(id="j", function="f", version=1, caller="c", sku="cpu", input=None, state=state)


@given(states, states)
def test_a_job_moves_only_along_the_transitions_table(old: JobState, new: JobState) -> None:
    job = make_job(old)
    if new in JOB_TRANSITIONS[old]:
        job.move_to(new)
        assert job.state is new
    else:
        with pytest.raises(IllegalTransition):
            job.move_to(new)
        assert job.state is old


@given(states, states)
def test_a_job_is_undone_only_along_the_undo_table(old: JobState, durable: JobState) -> None:
    job = make_job(old)
    if durable is old or durable in JOB_UNDOS[old]:
        job.undo_to(durable)
        assert job.state is durable
    else:
        with pytest.raises(IllegalTransition):
            job.undo_to(durable)
        assert job.state is old


def test_every_undo_reverses_a_move_of_the_table() -> None:
    for state, durables in JOB_UNDOS.items():
        for durable in durables:
            assert state in JOB_TRANSITIONS[durable], (durable, state)


def test_a_terminal_job_never_moves_again() -> None:
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert not JOB_TRANSITIONS[state]
