"""The dashboard's numbers (``broker.dashboard_views``) are the job records' own, on SQLite and
MySQL alike: start latencies, warm hits and calls of the last hour only, each pod's last job,
each function's versions and outcomes. Jobs are written through the store's own submit and
compare-and-set updates, as the dispatcher writes them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from broker.dashboard_views import (
    WINDOW_S,
    CapacityHistory,
    DashboardViews,
    percentile,
)
from broker.jobs import Attempt, Job
from broker.store import JobStore, open_store
from pool_manager.budgets import BudgetLedger
from pool_manager.model import PodInfo
from pool_manager.states import JobState, PodState
from tests.store.builders import make_job, make_spec

NOW = 1_900_000_000.0


@pytest.fixture(params=["sqlite", pytest.param("mysql", marks=pytest.mark.mysql)])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobStore]:
    """An empty store at the newest schema, once per backend (MySQL: a scratch database)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/jobs.db"
    else:
        url = str(request.getfixturevalue("mysql_url"))
    opened = await open_store(url)
    try:
        yield opened
    finally:
        await opened.close()


async def record(
    store: JobStore,
    *,
    ago: float,
    start: float | None,
    path: str | None,
    end: JobState | None = JobState.SUCCEEDED,
    pod: str = "cpu-a",
    **fields: object,
) -> Job:
    """A job submitted ``ago`` seconds before ``NOW``, acquired on ``path`` (None: still
    queued), first instruction ``start`` s after its submission, ended ``end``."""
    job = make_job(submitted=NOW - ago, sku="cpu", **fields)
    await store.submit(job)
    if path is None:
        return job
    job.move_to(JobState.RUNNING)
    job.acquisition = {"path": path, "reason": None if path == "warm" else "no_warm_pod"}
    job.started = job.submitted + 0.001
    job.attempts = [Attempt(job.next_attempt_id(), [pod], started=job.started)]
    if start is not None:
        job.first_instruction = job.submitted + start
    await store.update(job, job.revision)
    if end is not None:
        job.move_to(end)
        job.finished = job.submitted + (start or 0) + 0.5
        await store.update(job, job.revision)
    return job


def views(store: JobStore, pods: list[PodInfo] | None = None) -> DashboardViews:
    capacity = CapacityHistory(BudgetLedger({"cpu": 4}), lambda: NOW)
    return DashboardViews(store, lambda: list(pods or []), capacity, lambda: NOW)


async def test_start_latencies_and_warm_hits_count_the_last_hours_acquired_jobs(
    store: JobStore,
) -> None:
    await record(store, ago=100, start=0.02, path="warm")
    await record(store, ago=200, start=0.03, path="warm")
    await record(store, ago=300, start=0.40, path="idle")
    await record(store, ago=1900, start=2.50, path="new", end=JobState.FAILED)
    await record(store, ago=50, start=None, path="warm", end=None)  # running, not started
    await record(store, ago=10, start=None, path=None)  # queued
    await record(store, ago=WINDOW_S + 60, start=0.01, path="warm")  # before the window
    stats, plot = await views(store).start_stats()
    assert set(stats) == {"cpu"}
    cpu = stats["cpu"]  # times are epoch doubles: differences are exact to about 1e-6 s
    assert (cpu.acquired, cpu.warm) == (5, 3)
    assert cpu.starts == pytest.approx((0.02, 0.03, 0.40, 2.50), abs=1e-6)
    assert cpu.warm_hit_rate == 3 / 5
    assert (cpu.p50_s, cpu.p90_s) == pytest.approx((0.40, 2.50), abs=1e-6)
    assert plot.until == NOW and plot.since == NOW - WINDOW_S
    by_bucket = {round(at - plot.since): p50 for at, p50 in plot.starts}
    last_five_minutes = percentile([0.02, 0.03, 0.40], 0.5)
    assert by_bucket[WINDOW_S] == pytest.approx(last_five_minutes, abs=1e-6)
    # submitted 1900 s ago, 1700 s into the window: the bucket of 1500-1800 s
    assert by_bucket[1800] == pytest.approx(2.50, abs=1e-6)
    assert sum(1 for _, p50 in plot.starts if p50 is not None) == 2


async def test_a_pods_last_job_is_its_running_one_else_the_newest_that_ran_on_it(
    store: JobStore,
) -> None:
    await record(store, ago=300, start=0.1, path="idle", pod="cpu-a")
    newest_on_a = await record(store, ago=100, start=0.1, path="warm", pod="cpu-a")
    await record(store, ago=200, start=0.1, path="new", pod="cpu-b")
    pods = [
        PodInfo("cpu-a", "cpu", NOW - 600, state=PodState.IDLE, owner="alice",
                hold_until=NOW + 30),
        PodInfo("cpu-b", "cpu", NOW - 500, state=PodState.RUNNING, job_id="live-job"),
        PodInfo("cpu-c", "cpu", NOW - 400, state=PodState.IDLE, hold_until=NOW - 1),
        PodInfo("gpu-a", "h200", NOW - 300, state=PodState.IDLE),
    ]  # fmt: skip
    rows = await views(store, pods).pool_pods("cpu")
    assert [r.pod.name for r in rows] == ["cpu-a", "cpu-b", "cpu-c"]
    a, b, c = rows
    assert (a.last_job, a.hold_left_s, a.age_s) == (newest_on_a.id, 30.0, 600.0)
    assert (b.last_job, b.hold_left_s) == ("live-job", None)
    assert (c.last_job, c.hold_left_s) == (None, None)
    assert await views(store, pods).pool_pods("nope") == []


async def test_functions_show_their_live_versions_and_the_hours_outcomes(
    store: JobStore,
) -> None:
    for digest in ("a" * 64, "b" * 64):
        await store.put_function(make_spec(name="echo", package_digest=digest, owner="dev"))
    await store.put_function(make_spec(name="gone", owner="dev"))
    assert await store.delete_function("gone")
    await record(store, ago=10, start=0.1, path="warm", function="echo")
    await record(store, ago=20, start=0.1, path="warm", function="echo", end=JobState.FAILED)
    await record(store, ago=30, start=0.1, path="warm", function="echo", end=JobState.CANCELLED)
    await record(store, ago=40, start=None, path=None, function="echo")
    await record(store, ago=WINDOW_S + 5, start=0.1, path="warm", function="echo")
    await record(store, ago=10, start=0.1, path="warm", function="gone")
    uses = await views(store).function_uses()
    assert set(uses) == {"echo"}
    echo = uses["echo"]
    assert [(v.version, v.package_digest) for v in echo.versions] == [(2, "b" * 64), (1, "a" * 64)]
    assert (echo.calls, echo.succeeded, echo.failed) == (4, 1, 1)
    assert echo.success_rate == 0.5


async def test_the_jobs_list_filters_by_function_caller_and_state_without_outputs(
    store: JobStore,
) -> None:
    done = await record(store, ago=10, start=0.1, path="warm", function="echo", caller="bob")
    await record(store, ago=20, start=0.1, path="warm", function="other", caller="bob")
    await record(store, ago=30, start=None, path=None, function="echo", caller="carol")
    found = await views(store).find_jobs("echo", "bob", [JobState.SUCCEEDED], 10)
    assert [j.id for j in found] == [done.id]
    every = await views(store).find_jobs(None, None, None, 10)
    assert len(every) == 3 and all(j.output is None for j in every)
