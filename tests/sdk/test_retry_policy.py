"""The SDK's retry policy: what is sent again, how long it waits, and when it gives up."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest

from functions.client.errors import ApiError, PoolExhausted, UnexpectedAnswer, api_error
from functions.client.retrying import NO_RETRY, RetryPolicy, arun, run

TRANSPORT = (httpx.TransportError,)
JSON = "application/json"


def _error(error_class: str) -> bytes:
    return b'{"error": {"class": "%s", "message": "m"}}' % error_class.encode()


def _flaky(errors: list[BaseException]) -> tuple[list[float], Callable[[], str]]:
    """A call that raises ``errors`` in turn, then answers ``"ok"``; its try times."""
    tries: list[float] = []

    def call() -> str:
        tries.append(time.monotonic())
        if len(tries) <= len(errors):
            raise errors[len(tries) - 1]
        return "ok"

    return tries, call


def test_a_capacity_refusal_is_sent_again_after_its_retry_after() -> None:
    busy = PoolExhausted(503, "Unavailable", "busy", retry_after_s=0.3)
    tries, call = _flaky([busy, httpx.ConnectError("refused")])
    assert run(RetryPolicy(deadline_s=10).retrying(TRANSPORT), call) == "ok"
    assert len(tries) == 3
    assert tries[1] - tries[0] >= 0.3, "it waited what Retry-After said"


@pytest.mark.parametrize(
    "refusal",
    [
        ApiError(400, "InvalidRequest", "bad"),
        ApiError(422, "IdempotencyMismatch", "other body"),
        UnexpectedAnswer("http://x", 404, "text/html"),
    ],
)
def test_any_other_answer_is_raised_at_once(refusal: ApiError) -> None:
    tries, call = _flaky([refusal])
    with pytest.raises(type(refusal)):
        run(RetryPolicy().retrying(TRANSPORT), call)
    assert len(tries) == 1


def test_it_gives_up_when_the_next_wait_would_pass_the_deadline() -> None:
    busy = PoolExhausted(429, "QuotaExceeded", "later", retry_after_s=30)
    tries, call = _flaky([busy] * 5)
    started = time.monotonic()
    with pytest.raises(PoolExhausted):
        run(RetryPolicy(deadline_s=5).retrying(TRANSPORT), call)
    assert len(tries) == 1 and time.monotonic() - started < 1, "no 30 s wait past 5 s"
    tries, call = _flaky([httpx.ConnectError("refused")])
    with pytest.raises(httpx.ConnectError):
        run(NO_RETRY.retrying(TRANSPORT), call)


async def test_the_async_policy_retries_the_same_way() -> None:
    tries: list[int] = []

    async def call() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise api_error("http://x", 503, JSON, _error("Unavailable"), "0")
        return "ok"

    assert await arun(RetryPolicy(deadline_s=5).async_retrying(TRANSPORT), call) == "ok"
    assert len(tries) == 3


def test_an_error_answer_becomes_its_typed_refusal() -> None:
    body = b'{"error": {"class": "QuotaExceeded", "message": "m", "field": "f"}}'
    refusal = api_error("http://x", 429, "application/json", body, "2")
    assert isinstance(refusal, PoolExhausted) and refusal.retry_after_s == 2.0
    assert refusal.field == "f"
    assert type(api_error("http://x", 404, JSON, _error("NotFound"), None)) is ApiError
    assert isinstance(api_error("http://x", 502, "text/html", b"<html>", None), UnexpectedAnswer)
    undated = api_error("http://x", 503, JSON, _error("Unavailable"), "soon")
    assert undated.retry_after_s is None, "a Retry-After that is no number of seconds"
