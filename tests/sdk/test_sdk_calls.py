"""The SDK's surface through the real HTTP server (uvicorn on loopback, fake pods):
``AsyncClient.map`` keeps input order, ``return_exceptions`` yields a failed item's typed
error, a call refused for capacity is sent again with its Idempotency-Key after the
gateway's ``Retry-After``, and the sync handles follow a job."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from functions.client.errors import JobTimeout
from functions.sdk import AsyncClient, FunctionError, PoolExhausted, RetryPolicy
from gateway.auth import Role
from gateway.errors import RETRY_AFTER_S
from tests.helpers import ThreadedBroker, threaded_broker

CATALOG = "pools:\n  cpu: {min_count: 2, max_idle_count: 8, max_count: 8}\nbudgets: {cpu: 8}\n"
CODE = """
import time


def double(x):
    if x == "boom":
        raise ValueError("boom is not a number")
    return x * 2


def nap(seconds):
    time.sleep(seconds)
    return "rested"
"""


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[ThreadedBroker]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "calc.py").write_text(CODE)
    with threaded_broker(tmp_path / "home", CATALOG, backend="fake") as server:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(code, name="double", sku="cpu", entrypoint="calc:double", max_retries=0)
            fp.deploy(code, name="nap", sku="cpu", entrypoint="calc:nap", max_retries=0)
        yield server


async def test_async_map_over_200_inputs_yields_every_output_in_input_order(
    gateway: ThreadedBroker,
) -> None:
    async with AsyncClient(gateway.url, gateway.token("mapper")) as fp:
        outputs = [out async for out in fp.function("double").map(range(200), concurrency=16)]
    assert outputs == [2 * i for i in range(200)]


async def test_async_map_with_return_exceptions_yields_a_failed_items_typed_error_in_its_place(
    gateway: ThreadedBroker,
) -> None:
    inputs: list[object] = [*range(10), "boom", *range(10, 20)]
    async with AsyncClient(gateway.url, gateway.token("mapper")) as fp:
        double = fp.function("double")
        outputs = [out async for out in double.map(inputs, concurrency=4, return_exceptions=True)]
        with pytest.raises(FunctionError, match="boom is not a number"):
            [out async for out in double.map(inputs, concurrency=4)]
    failed = outputs.pop(10)
    assert isinstance(failed, FunctionError) and failed.error_class == "FunctionError"
    assert failed.job["state"] == "FAILED"
    assert outputs == [2 * i for i in range(20)]


def test_sync_map_yields_in_input_order_and_the_failed_items_error(
    gateway: ThreadedBroker,
) -> None:
    with gateway.client("mapper") as fp:
        outputs = list(fp.function("double").map([1, "boom", 3], return_exceptions=True))
    assert outputs[0] == 2 and outputs[2] == 6
    assert isinstance(outputs[1], FunctionError)


def test_a_submitted_job_is_followed_to_its_result_and_one_can_be_cancelled(
    gateway: ThreadedBroker,
) -> None:
    with gateway.client("follower") as fp:
        job = fp.function("double").submit(21)
        assert job.result(timeout=30) == 42 and job.status() == "SUCCEEDED"
        slow = fp.function("nap").submit(30)
        assert slow.status() in ("QUEUED", "RUNNING")
        slow.cancel()
        with pytest.raises(Exception) as ended:
            slow.result(timeout=30)
        assert type(ended.value).__name__ == "JobCancelled", ended.value
        timed_out = fp.function("nap").submit(5, timeout_s=0.2)
        with pytest.raises(JobTimeout):
            timed_out.result(timeout=30)


async def test_an_async_job_is_followed_and_its_log_read(gateway: ThreadedBroker) -> None:
    async with AsyncClient(gateway.url, gateway.token("follower")) as fp:
        job = await fp.function("double").submit(5)
        assert await job.result(timeout=30) == 10
        assert await job.status() == "SUCCEEDED"
        assert b"".join([chunk async for chunk in job.logs()]) == b""


def test_a_call_refused_for_capacity_is_sent_again_after_retry_after_as_the_same_job(
    gateway: ThreadedBroker,
) -> None:
    """The broker stops taking jobs (503 ``Unavailable`` with ``Retry-After``) and takes
    them again 1.5 s later: the SDK's call waits as told and lands once."""
    broker = gateway.broker
    broker.accepting = False
    refused = httpx.post(
        f"{gateway.url}/v1/functions/double:invoke",
        json={"input": 1},
        headers={"Authorization": f"Bearer {gateway.token('retrier')}"},
    )
    assert refused.status_code == 503, refused.text
    assert refused.headers["Retry-After"] == str(RETRY_AFTER_S)
    reopen = threading.Timer(1.5, lambda: setattr(broker, "accepting", True))
    reopen.start()
    started = time.monotonic()
    with gateway.client("retrier") as fp:
        assert fp.function("double").invoke(4, idempotency_key="retry-after-1") == 8
        waited = time.monotonic() - started
        assert waited >= 1.0, "it waited as Retry-After said"
        again = fp.function("double").invoke_record(4, idempotency_key="retry-after-1")
    reopen.join()
    assert again["output"] == 8
    with gateway.client("retrier") as fp:
        mine = fp.jobs()
    assert [j["id"] for j in mine] == [again["id"]], "one job however often it was sent"


async def test_a_refusal_that_outlasts_the_deadline_raises_pool_exhausted(
    gateway: ThreadedBroker,
) -> None:
    gateway.broker.accepting = False
    try:
        quick = RetryPolicy(deadline_s=1.5)
        async with AsyncClient(gateway.url, gateway.token("impatient"), retry=quick) as fp:
            with pytest.raises(PoolExhausted) as refused:
                await fp.function("double").invoke(1)
    finally:
        gateway.broker.accepting = True
    assert refused.value.status == 503 and refused.value.retry_after_s == RETRY_AFTER_S


def test_a_call_may_ask_for_a_fresh_pod_of_its_own(gateway: ThreadedBroker) -> None:
    with gateway.client("fresh") as fp:
        double = fp.function("double")
        warm = double.invoke_record(1, tag="s")
        fresh = double.invoke_record(2, tag="s", single_use=True)
        after = double.invoke_record(3, tag="s")
    pod = {name: job["attempts"][0]["pods"][0] for name, job in
           (("warm", warm), ("fresh", fresh), ("after", after))}  # fmt: skip
    assert fresh["acquisition"]["path"] == "single_use" and fresh["single_use"] is True
    assert pod["fresh"] != pod["warm"], "not the session's warm pod"
    assert pod["after"] != pod["fresh"], "the fresh pod retired after its job"
    assert "single_use" not in after


def test_a_head_of_a_followed_log_leaves_its_connection_free_while_the_job_runs(
    gateway: ThreadedBroker,
) -> None:
    """HEAD reads a route's headers: a followed log must not hold the kept-alive connection
    until the job ends (the client's next request on it would wait as long)."""
    with gateway.client("follower") as fp:
        slow = fp.function("nap").submit(30)
        headers = {"Authorization": f"Bearer {gateway.token('follower')}"}
        with httpx.Client(base_url=gateway.url, headers=headers, timeout=10) as http:
            start = time.monotonic()
            assert http.head(f"/v1/jobs/{slow.id}/logs?follow=1").status_code == 200
            assert http.get("/v1/jobs").status_code == 200  # on the same connection
            assert time.monotonic() - start < 5
        slow.cancel()
