"""Bounded retries: only a lost pod, or a failure before any user code, is retried."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.retry_policy import NEVER_RETRY, decide
from functions.errors import ErrorClass


@pytest.mark.parametrize("cls", sorted(NEVER_RETRY))
@pytest.mark.parametrize("ran", [True, False, None])
def test_a_function_failure_is_never_retried(cls: ErrorClass, ran: bool | None) -> None:
    assert not decide(cls, ran_user_code=ran, retries=0, max_retries=10).retry


@pytest.mark.parametrize("ran", [True, False, None])
def test_a_lost_pod_is_retried_within_the_budget(ran: bool | None) -> None:
    assert decide("PodLost", ran_user_code=ran, retries=1, max_retries=2).retry
    spent = decide("PodLost", ran_user_code=ran, retries=2, max_retries=2)
    assert not spent.retry and "budget" in spent.reason


def test_an_infrastructure_failure_is_retried_only_when_no_user_code_ran() -> None:
    assert decide(ErrorClass.UNAVAILABLE, ran_user_code=False, retries=0, max_retries=1).retry
    assert not decide(ErrorClass.UNAVAILABLE, ran_user_code=True, retries=0, max_retries=1).retry
    assert not decide(ErrorClass.INTERNAL, ran_user_code=None, retries=0, max_retries=1).retry


@pytest.mark.parametrize(
    "cls",
    [
        ErrorClass.CANCELLED,
        ErrorClass.PACKAGE_REJECTED,
        ErrorClass.DEPENDENCY_INSTALL_FAILED,
        ErrorClass.QUOTA_EXCEEDED,
        ErrorClass.NOT_FOUND,
    ],
)
def test_deterministic_and_requested_endings_are_not_retried(cls: ErrorClass) -> None:
    assert not decide(cls, ran_user_code=False, retries=0, max_retries=5).retry


def test_success_and_unknown_classes_end_the_job() -> None:
    assert not decide(None, ran_user_code=True, retries=0, max_retries=3).retry
    assert not decide("Gremlins", ran_user_code=False, retries=0, max_retries=3).retry


@given(
    cls=st.sampled_from([*ErrorClass, None]),
    ran=st.sampled_from([True, False, None]),
    retries=st.integers(0, 12),
    max_retries=st.integers(0, 10),
)
def test_retries_are_bounded_and_never_rerun_code_the_function_failed(
    cls: ErrorClass | None, ran: bool | None, retries: int, max_retries: int
) -> None:
    decision = decide(cls, ran_user_code=ran, retries=retries, max_retries=max_retries)
    if decision.retry:
        assert retries < max_retries
        assert cls is ErrorClass.POD_LOST or ran is False
        assert cls not in NEVER_RETRY
