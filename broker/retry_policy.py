"""Bounded automatic retries: whether a failed attempt is retried or the job ends.

Pure and total: ``decide`` looks only at its arguments, never at the clock or a store, so the
dispatcher, restart recovery and the simulator share it and the property tests can enumerate
it. The rule (paper §A.1, A.6; ``functions.errors``): a caller's code is never run twice on our
initiative unless the *pod* failed under it. So an attempt is retried only when

- it failed with ``PodLost`` (the pod, not the function, failed), or
- it provably ran no user code (the agent reported it never reached the entrypoint) and the
  failure is one a fresh pod may not repeat (``Unavailable``, ``InternalError``, and
  ``PackageFetchFailed``: the next attempt gets a fresh URL, and the store may be back),

and only while ``retries < max_retries``. ``FunctionError``, ``NonZeroExit``, ``OOM`` and
``Timeout`` are the function's own outcome and never retry; request errors (``PackageRejected``,
``NotFound``, ``QuotaExceeded``...) and ``DependencyInstallFailed`` (a pin set that failed to
install fails again on the same base image) would fail the same way again; ``Cancelled`` is
the caller's wish. An unknown class ends the job (fail closed).
"""

from __future__ import annotations

from dataclasses import dataclass

from functions.errors import ErrorClass

#: The function's own outcome: retrying would run the caller's code again for the same result.
NEVER_RETRY: frozenset[ErrorClass] = frozenset(
    {ErrorClass.FUNCTION_ERROR, ErrorClass.NON_ZERO_EXIT, ErrorClass.OOM, ErrorClass.TIMEOUT}
)

#: Retried whether or not user code ran: the pod failed, not the function.
RETRY_ALWAYS: frozenset[ErrorClass] = frozenset({ErrorClass.POD_LOST})

#: Retried only when the attempt provably ran no user code: a fresh pod may well succeed.
RETRY_IF_NO_USER_CODE: frozenset[ErrorClass] = frozenset(
    {ErrorClass.UNAVAILABLE, ErrorClass.INTERNAL, ErrorClass.PACKAGE_FETCH_FAILED}
)


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """``retry``: re-queue the job for another attempt; ``reason`` says why, for logs."""

    retry: bool
    reason: str


def decide(
    error_class: ErrorClass | str | None,
    *,
    ran_user_code: bool | None,
    retries: int,
    max_retries: int,
) -> RetryDecision:
    """Decide whether an attempt that ended with ``error_class`` is retried.

    ``error_class`` None means the attempt succeeded. ``ran_user_code``: False only when the
    agent proved the entrypoint never started; None (unknown, e.g. the agent is unreachable)
    counts as True. ``retries`` is the number of retries already made.
    """
    if error_class is None:
        return RetryDecision(False, "succeeded")
    try:
        cls = ErrorClass(error_class)
    except ValueError:
        return RetryDecision(False, f"unknown error class {error_class!r}: not retried")
    if cls in NEVER_RETRY:
        return RetryDecision(False, f"{cls} is the function's own outcome")
    if cls in RETRY_ALWAYS:
        why = f"{cls}: the pod failed, not the function"
    elif cls in RETRY_IF_NO_USER_CODE:
        if ran_user_code is not False:
            return RetryDecision(False, f"{cls} after user code may have run")
        why = f"{cls} before any user code ran"
    else:
        return RetryDecision(False, f"{cls} would fail the same way again")
    if retries >= max_retries:
        return RetryDecision(False, f"{why}; retry budget spent ({retries}/{max_retries})")
    return RetryDecision(True, f"{why}; retry {retries + 1}/{max_retries}")
