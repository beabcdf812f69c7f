"""A finished job's outcome is in the store before anything acts on it: the pods' reset (which
makes the agent forget the result) and the caller's answer.

A store write that fails at the end of a job is retried, not logged and passed over: else the
caller would be answered SUCCEEDED while the store keeps the job RUNNING, and the agent would
have forgotten the result a restarted broker needs. Two ways a write fails, each run here on a
real broker in this process (``tests.helpers.threaded_broker``): a record the store cannot
take (on MySQL, an output near the body cap over the default ``max_allowed_packet``; here the
store's limit is lowered so a small output reaches it on SQLite), and a store that fails for a
while (``JobStore.update`` patched to raise a few times, as a dropped connection does).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from broker.jobs import Job
from broker.store import JobStore
from functions.sdk import ApiError, Client
from gateway.auth import Role
from pool_manager.states import TERMINAL_JOB_STATES, JobState
from tests.conftest import BEHAVIOURS, EXAMPLES
from tests.helpers import ThreadedBroker, threaded_broker


def test_an_outcome_the_store_cannot_hold_fails_the_job_too_large(tmp_path: Path) -> None:
    with threaded_broker(tmp_path / "home") as served:
        assert served.broker.store is not None
        served.broker.store.max_statement_bytes = 100_000
        with served.client("dev", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="sized", sku="cpu", entrypoint="behaviours:sized")
        with served.client("user", Role.INVOKE) as fp:
            # 60,000 quotes: 120 kB of JSON, 240 kB once the store escapes it.
            big = fp.invoke("sized", 60_000, lease_tag="t")
            stored = fp.job(big["id"])
            small = fp.invoke("sized", 10, lease_tag="t")
            with pytest.raises(ApiError) as refused:
                fp.submit("sized", "x" * 120_000)
    assert big["state"] == stored["state"] == "FAILED", big
    assert big["error"]["class"] == stored["error"]["class"] == "TooLarge"
    assert "the job's outcome would take" in big["error"]["message"]
    assert big["output"] is None and stored["output"] is None
    assert small["state"] == "SUCCEEDED" and small["output"] == '"' * 10
    assert small["acquisition"]["path"] == "warm", "the pod was reset and kept, not lost"
    assert (refused.value.status, refused.value.error_class) == (413, "TooLarge")


def _store_refuses_outcomes(
    monkeypatch: pytest.MonkeyPatch, input_value: str, down: Callable[[], bool]
) -> None:
    """``JobStore.update`` fails, as a dropped connection does, for the final write of the job
    whose input is ``input_value`` while ``down()`` says so."""
    real_update = JobStore.update

    async def update(self: JobStore, job: Job, revision: int) -> Any:
        if job.input == input_value and job.state in TERMINAL_JOB_STATES and down():
            raise ConnectionError("the store is down")
        return await real_update(self, job, revision)

    monkeypatch.setattr(JobStore, "update", update)


class _Outage:
    """A store that refuses the first ``times`` writes it is asked about, then takes them
    (``down`` for ``_store_refuses_outcomes``); ``refusals`` counts the questions."""

    def __init__(self, times: int) -> None:
        self.times = times
        self.refusals = 0

    def __call__(self) -> bool:
        self.refusals += 1
        return self.refusals <= self.times


def _caller(served: ThreadedBroker) -> Client:
    """A caller's client, the ``noop`` example deployed."""
    with served.client("dev", Role.DEPLOY) as fp:
        fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop")
    return served.client("user", Role.INVOKE)


def test_an_outcome_is_retried_until_the_store_takes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    down = _Outage(times=3)
    _store_refuses_outcomes(monkeypatch, "flaky", down)
    with threaded_broker(tmp_path / "home") as served, _caller(served) as fp:
        job = fp.invoke("noop", "flaky", lease_tag="t")
        stored = fp.job(job["id"])
        after = fp.invoke("noop", "fine", lease_tag="t")
    assert down.refusals == 4, "refused three times, then recorded"
    assert job["state"] == stored["state"] == "SUCCEEDED", (job, stored)
    assert stored["output"] == "flaky"
    assert after["state"] == "SUCCEEDED" and after["acquisition"]["path"] == "warm"


def test_until_its_outcome_is_recorded_a_job_reads_as_the_store_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While its outcome is being retried, a job reads as the store has it (RUNNING), to a
    GET and to a cancel, not as the outcome that is not recorded yet."""
    store_up, refused = threading.Event(), threading.Event()

    def down() -> bool:
        refused.set()
        return not store_up.is_set()

    _store_refuses_outcomes(monkeypatch, "held", down)
    with threaded_broker(tmp_path / "home") as served, _caller(served) as fp:
        job_id = fp.submit("noop", "held")
        assert refused.wait(30), "the attempt never ended"
        seen = [fp.job(job_id)["state"] for _ in range(5)]
        cancelled = fp.cancel(job_id)["state"]
        store_up.set()
        done = fp.wait(job_id, timeout_s=30)
    assert seen == ["RUNNING"] * 5, seen
    assert cancelled == "RUNNING", "too late to cancel; and not terminal until recorded"
    assert done["state"] == "SUCCEEDED" and done["output"] == "held"


def test_a_job_whose_function_is_gone_fails_only_once_the_store_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A queued job whose function version is gone by the time it starts fails NotFound,
    and reads FAILED only once the store has it: a failure the store refuses is retried, not
    answered while the store keeps the job QUEUED with nothing to run it."""
    down = _Outage(times=3)
    _store_refuses_outcomes(monkeypatch, "orphan", down)
    with threaded_broker(tmp_path / "home") as served, _caller(served) as fp:
        dispatcher = served.broker.dispatcher
        real_functions = dispatcher.functions

        async def gone_for_orphans(name: str, version: int) -> Any:
            return None if name == "noop" else await real_functions(name, version)

        # As after a restart that finds the queued job's function deleted: no cached spec.
        monkeypatch.setattr(dispatcher, "functions", gone_for_orphans)
        monkeypatch.setattr(dispatcher, "specs", _Forgetful())
        job = fp.invoke("noop", "orphan", lease_tag="t")
        stored = fp.job(job["id"])
    assert down.refusals == 4, "refused three times, then recorded"
    assert job["state"] == stored["state"] == "FAILED", (job, stored)
    assert job["error"]["class"] == stored["error"]["class"] == "NotFound"
    assert "is gone" in stored["error"]["message"]


class _Forgetful(dict[tuple[str, int], Any]):
    """A spec cache that never holds a spec."""

    def __setitem__(self, key: tuple[str, int], value: Any) -> None:
        pass


def test_until_its_running_commit_lands_a_job_reads_queued(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Until its RUNNING commit lands, a job reads QUEUED: a crash before then re-queues it
    (nothing of it ran), so RUNNING must not be read before it is stored."""
    entered, released = threading.Event(), threading.Event()
    real_update = JobStore.update

    async def slow_running_commit(self: JobStore, job: Job, revision: int) -> Any:
        if job.input == "slow start" and job.state is JobState.RUNNING and not entered.is_set():
            entered.set()  # the commit is in flight until the test has read and cancelled
            await asyncio.to_thread(released.wait, 30)
        return await real_update(self, job, revision)

    monkeypatch.setattr(JobStore, "update", slow_running_commit)
    with threaded_broker(tmp_path / "home") as served, _caller(served) as fp:
        job_id = fp.submit("noop", "slow start")
        try:
            assert entered.wait(30), "the job never started"
            seen = [fp.job(job_id)["state"] for _ in range(3)]
            cancel_answer = fp.cancel(job_id)["state"]
        finally:
            released.set()
        done = fp.wait(job_id, timeout_s=30)
    assert seen == ["QUEUED"] * 3, seen
    assert cancel_answer == "QUEUED", "answered as the store has it"
    assert done["state"] == "CANCELLED" and done["timings"]["first_instruction"] is None, done
