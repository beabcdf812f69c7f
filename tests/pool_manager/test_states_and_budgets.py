"""Lifecycles as data (one table, one transition function) and the budget ledger."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pool_manager.budgets import BudgetLedger
from pool_manager.states import (
    JOB_TRANSITIONS,
    POD_TRANSITIONS,
    IllegalTransition,
    JobState,
    PodState,
    TransitionLog,
    transition,
)
from tests.pool_manager.builders import add_ready, make_request, make_tracker, run_job


@dataclass
class Job:
    state: JobState = JobState.PENDING
    history: list[tuple[float, str, str, str]] = field(default_factory=list)


def test_every_state_has_a_row_in_its_transitions_table() -> None:
    assert set(POD_TRANSITIONS) == set(PodState)
    assert set(JOB_TRANSITIONS) == set(JobState)


def test_a_legal_transition_is_recorded_with_time_and_reason() -> None:
    job = Job()
    transition(job, JobState.QUEUED, "accepted", 5.0, JOB_TRANSITIONS)
    assert job.state is JobState.QUEUED
    assert job.history == [(5.0, "PENDING", "QUEUED", "accepted")]


def test_an_illegal_transition_is_rejected_and_changes_nothing() -> None:
    job = Job(state=JobState.SUCCEEDED)
    with pytest.raises(IllegalTransition):
        transition(job, JobState.RUNNING, "again?", 1.0, JOB_TRANSITIONS)
    assert job.state is JobState.SUCCEEDED and job.history == []


def test_a_deleted_pod_never_comes_back() -> None:
    assert POD_TRANSITIONS[PodState.DELETED] == frozenset()


def test_the_pod_log_answers_why_a_pod_is_where_it_is() -> None:
    t = make_tracker()
    add_ready(t, "p")
    run_job(t, make_request("alice"), now=3.0)
    steps = [(old, new, why) for _, old, new, why in t.history("p")]
    assert steps == [
        ("STARTING", "IDLE", "ready"),
        ("IDLE", "ASSIGNED", "idle"),
        ("ASSIGNED", "RUNNING", "launched"),
        ("RUNNING", "IDLE", "released"),
    ]


def test_the_pod_log_is_bounded() -> None:
    log = TransitionLog(maxlen=3)
    for i in range(10):
        log.record(float(i), "p", "IDLE", "ASSIGNED", "x")
    assert len(log) == 3 and [t for t, *_ in log.of("p")] == [7.0, 8.0, 9.0]


def test_a_reservation_past_the_budget_is_refused() -> None:
    ledger = BudgetLedger({"h200": 2})
    assert ledger.reserve("h200", 2)
    assert not ledger.reserve("h200", 1)
    ledger.release("h200", 1)
    assert ledger.reserve("h200", 1)
    assert ledger.headroom("h200") == 0


def test_an_accelerator_without_a_budget_is_unbounded() -> None:
    ledger = BudgetLedger()
    assert ledger.reserve("cpu", 10**6) and ledger.headroom("cpu") is None


def test_releasing_more_than_reserved_is_an_error() -> None:
    with pytest.raises(ValueError):
        BudgetLedger({"cpu": 4}).release("cpu", 1)


def test_concurrent_reservations_never_overshoot_the_budget() -> None:
    ledger = BudgetLedger({"h200": 50})
    granted = [0] * 8

    def grab(k: int) -> None:
        for _ in range(100):
            if ledger.reserve("h200", 1):
                granted[k] += 1

    threads = [threading.Thread(target=grab, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sum(granted) == 50 and ledger.used("h200") == 50


@given(
    st.lists(
        st.tuples(
            st.sampled_from(("reserve", "release", "force", "clear", "read")),
            st.sampled_from(("h200", "cpu")),
            st.integers(1, 3),
            st.floats(0.0, 100.0),
        ),
        max_size=40,
    )
)
def test_held_unit_seconds_is_the_integral_of_what_is_held(
    ops: list[tuple[str, str, int, float]],
) -> None:
    """Against a step-by-step integral: whatever the order of reservations, releases,
    restarts (``force``, ``clear``) and reads, the counter is Σ used x dt and never drops."""
    now = [0.0]
    ledger = BudgetLedger({"h200": 4}, clock=lambda: now[0])
    used = {"h200": 0, "cpu": 0}
    area = {"h200": 0.0, "cpu": 0.0}
    last = ledger.held_unit_seconds()
    for op, acc, units, dt in ops:
        for a in used:
            area[a] += used[a] * dt
        now[0] += dt
        if op == "reserve" and ledger.reserve(acc, units):
            used[acc] += units
        elif op == "release" and used[acc] >= units:
            ledger.release(acc, units)
            used[acc] -= units
        elif op == "force":
            ledger.force(acc, units)
            used[acc] += units
        elif op == "clear":
            ledger.clear()
            used = dict.fromkeys(used, 0)
        held = ledger.held_unit_seconds()
        for a in used:
            assert held.get(a, 0.0) == pytest.approx(area[a], rel=1e-9, abs=1e-9)
            assert held.get(a, 0.0) >= last.get(a, 0.0) - 1e-9
        last = held
