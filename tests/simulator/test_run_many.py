"""``run_many``: forked workers return every run's result, in task order, or its error."""

from __future__ import annotations

import os

import pytest

from simulator import experiment
from simulator.arms import arm_names
from simulator.experiment import Task, Workload, run_many
from simulator.venue import load_venue
from tests.simulator.fresh import in_a_fresh_process


def _tasks(n: int, workload: Workload | None = None) -> list[Task]:
    venue, arms = load_venue("prod-cpu"), arm_names("reuse-on,reuse-off")
    wl = workload or Workload("w-rl")
    return [(venue, arms[k % 2], wl, 1 + k // 2, None) for k in range(n)]


_TASKS = """
import os, time
from simulator import experiment
from simulator.arms import arm_names
from simulator.experiment import Workload, run_many
from simulator.venue import load_venue

def tasks(n):
    venue, arms = load_venue("prod-cpu"), arm_names("reuse-on,reuse-off")
    return [(venue, arms[k % 2], Workload("w-rl"), 1 + k // 2, None) for k in range(n)]
"""


def test_forked_workers_return_every_result_in_task_order() -> None:
    out = in_a_fresh_process(
        """
        serial = run_many(tasks(7), 1)
        print(all(run_many(tasks(7), workers) == serial for workers in (2, 3, 16)))
    """,
        _TASKS,
    )
    assert out.split() == ["True"]


def test_runs_are_spread_over_the_parent_and_its_children() -> None:
    out = in_a_fresh_process(
        """
        real = experiment._run_task

        def run_task(task):
            time.sleep(0.02)  # long enough that a child started late still takes a task
            return real(task)[0], os.getpid()  # which process ran it, not the job count

        experiment._run_task = run_task
        pids = [pid for _, pid in run_many(tasks(8), 2)]
        print(os.getpid() in pids, len(set(pids)))
    """,
        _TASKS,
    )
    assert out.split() == ["True", "2"], "the caller runs a share itself, one child the rest"


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
