"""When the SDK sends a request again, and how long it waits first (tenacity).

A request is sent again after a connection error (refused, reset, cut mid-answer: the broker
restarting) or a refusal for capacity (429 ``QuotaExceeded``, 503 ``Unavailable``, or a
proxy's 502/503/504), never after any other answer. It waits what the refusal's
``Retry-After`` says, else an exponential backoff with jitter, and gives up (raising the last
error) when the next wait would pass the policy's total deadline. Requests that create
something carry an Idempotency-Key the caller made once, so sending one again finds the job
the first created instead of making a second.

A ``Retrying`` object keeps per-call state, so each call takes its own copy (``run`` and
``arun`` do): safe from many threads and many tasks at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_before_delay,
    wait_exponential_jitter,
)

from functions.client.errors import ApiError, UnexpectedAnswer

T = TypeVar("T")
RETRIED_STATUS = frozenset({429, 503})
"""Refusals for capacity or quota: the gateway says ``Retry-After`` with each."""
PROXY_STATUS = frozenset({502, 503, 504})
"""What a proxy in front of a restarting gateway answers (not the API's JSON)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a client retries (module docstring). ``deadline_s`` 0 sends each request once."""

    deadline_s: float = 120.0
    """Total seconds from a call's first try to its last, waits included."""
    first_backoff_s: float = 0.05
    """The first wait when the refusal names none; it doubles with each try."""
    max_backoff_s: float = 2.0
    """The longest wait the backoff itself chooses (``Retry-After`` may ask more)."""

    def should_retry(self, exc: BaseException, transport: tuple[type[BaseException], ...]) -> bool:
        if isinstance(exc, UnexpectedAnswer):
            return exc.status in PROXY_STATUS
        if isinstance(exc, ApiError):
            return exc.status in RETRIED_STATUS
        return isinstance(exc, transport)

    def _options(self, transport: tuple[type[BaseException], ...]) -> dict[str, object]:
        backoff = wait_exponential_jitter(
            multiplier=self.first_backoff_s, max=self.max_backoff_s, jitter=self.first_backoff_s
        )

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome is not None else None
            if isinstance(exc, ApiError) and exc.retry_after_s is not None:
                return exc.retry_after_s
            return backoff(state)

        return {
            "retry": retry_if_exception(lambda exc: self.should_retry(exc, transport)),
            "wait": wait,
            "stop": stop_before_delay(self.deadline_s),
            "reraise": True,
        }

    def retrying(self, transport: tuple[type[BaseException], ...]) -> Retrying:
        """A template for sync calls; ``run`` copies it per call."""
        return Retrying(**self._options(transport))  # type: ignore[arg-type]

    def async_retrying(self, transport: tuple[type[BaseException], ...]) -> AsyncRetrying:
        """A template for async calls; ``arun`` copies it per call."""
        return AsyncRetrying(**self._options(transport))  # type: ignore[arg-type]


NO_RETRY = RetryPolicy(deadline_s=0.0)


def run(template: Retrying, fn: Callable[[], T]) -> T:
    """``fn()``, sent again as ``template`` says."""
    return template.copy()(fn)


async def arun(template: AsyncRetrying, fn: Callable[[], Awaitable[T]]) -> T:
    """``await fn()``, sent again as ``template`` says (``fn`` an ``async def``: tenacity
    awaits only what a coroutine function returns)."""
    result: T = await template.copy()(fn)
    return result
