"""A job re-attached after a broker restart is waited for as long as its attempt may run:
its own ``timeout_s``, else its function's (what the agent was told), never a day, and
for a function with requirements their install's budget too (``executor.attempt_deadline_s``).

A unit test of ``recovery._reattach`` over stand-ins for the broker's dispatcher and executor
(only the two calls it makes): the real restart path is covered end to end by
``test_recovery.py``, which cannot observe the wait's length without waiting it out."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace
from typing import Any

from broker.executor import GRACE_S
from broker.jobs import Attempt, Job
from broker.recovery import _reattach
from functions.spec import MAX_TIMEOUT_S, FunctionSpec
from pod_runtime.deps import INSTALL_TIMEOUT_S
from pool_manager.states import JobState


def _broker(spec: FunctionSpec | None) -> tuple[Any, list[float]]:
    waited: list[float] = []

    async def reattach(pods: list[str], attempt_id: str, timeout: float) -> str:
        waited.append(timeout)
        return "outcome"

    async def finish(job: Job, pods: list[str], outcome: str, **kwargs: Any) -> None:
        assert outcome == "outcome" and kwargs == {"cancel_may_be_lost": True}

    async def function_version(name: str, version: int) -> FunctionSpec | None:
        return spec

    dispatcher = SimpleNamespace(executor=SimpleNamespace(reattach=reattach), finish=finish)
    return SimpleNamespace(dispatcher=dispatcher, function_version=function_version), waited


def _job(timeout_s: float | None) -> Job:
    return Job(
        id="j1",
        function="slow",
        version=1,
        caller="c",
        sku="cpu",
        input=None,
        state=JobState.RUNNING,
        timeout_s=timeout_s,
        attempts=[Attempt(id="j1:0", pods=["p1"])],
    )


SPEC = FunctionSpec(
    name="slow", sku="cpu", package_digest="0" * 64, entrypoint="m:f", timeout_s=42.0
)


def test_a_reattached_job_without_a_timeout_waits_its_functions_timeout() -> None:
    broker, waited = _broker(SPEC)
    asyncio.run(_reattach(broker, _job(None), ["p1"]))
    assert waited == [42.0 + GRACE_S]


def test_a_reattached_job_with_its_own_timeout_waits_that() -> None:
    broker, waited = _broker(SPEC)
    asyncio.run(_reattach(broker, _job(5.0), ["p1"]))
    assert waited == [5.0 + GRACE_S]


def test_a_reattached_job_whose_function_is_gone_waits_the_longest_timeout() -> None:
    broker, waited = _broker(None)
    asyncio.run(_reattach(broker, _job(None), ["p1"]))
    assert waited == [MAX_TIMEOUT_S + GRACE_S + INSTALL_TIMEOUT_S]


def test_a_reattached_job_with_requirements_waits_through_their_install_too() -> None:
    broker, waited = _broker(dataclasses.replace(SPEC, requirements_digest="1" * 64))
    asyncio.run(_reattach(broker, _job(5.0), ["p1"]))
    assert waited == [5.0 + GRACE_S + INSTALL_TIMEOUT_S]
