"""``run_many``: forked workers return every run's result, in task order, or its error."""

from __future__ import annotations

import os
import threading
import time

import pytest

from simulator import experiment
from simulator.arms import arm_names
from simulator.experiment import Task, Workload, run_many
from simulator.venue import load_venue


def _tasks(n: int, workload: Workload | None = None) -> list[Task]:
    venue, arms = load_venue("prod-cpu"), arm_names("reuse-on,reuse-off")
    wl = workload or Workload("w-rl")
    return [(venue, arms[k % 2], wl, 1 + k // 2, None) for k in range(n)]


def test_forked_workers_return_every_result_in_task_order() -> None:
    assert threading.active_count() == 1, "run_many would not fork: this would test nothing"
    tasks = _tasks(7)
    serial = run_many(tasks, 1)
    for workers in (2, 3, 16):
        assert run_many(tasks, workers) == serial


def test_runs_are_spread_over_the_parent_and_its_children(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = experiment._run_task

    def run_task(task: Task) -> tuple[experiment.RunMetrics, int]:
        time.sleep(0.02)  # long enough that a child started late still takes a task
        return real(task)[0], os.getpid()  # which process ran it, in place of the job count

    monkeypatch.setattr(experiment, "_run_task", run_task)
    pids = [pid for _, pid in run_many(_tasks(8), 2)]
    assert os.getpid() in pids, "the calling process runs a share itself"
    assert len(set(pids)) == 2


def test_an_error_in_any_worker_reaches_the_caller() -> None:
    bad = Workload("sessions", pattern="no-such-pattern")  # raises only once it runs
    tasks = _tasks(4) + _tasks(1, bad) + _tasks(4)
    for workers in (1, 2, 3):
        with pytest.raises(ValueError, match="unknown arrival pattern"):
            run_many(tasks, workers)


def test_without_memfd_the_runs_stay_in_this_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where Linux's ``memfd_create`` is missing (macOS) the shared counter cannot exist, so
    every run happens here, serially, with the same results."""
    real = experiment._run_task
    serial = run_many(_tasks(4), 1)

    def run_task(task: Task) -> tuple[experiment.RunMetrics, int]:
        return real(task)[0], os.getpid()

    monkeypatch.delattr(os, "memfd_create")
    assert [m for m, _ in run_many(_tasks(4), 2)] == [m for m, _ in serial]
    monkeypatch.setattr(experiment, "_run_task", run_task)
    assert {pid for _, pid in run_many(_tasks(4), 2)} == {os.getpid()}
