"""A workload or benchmark parameter out of range is a typed error naming it, never a quiet
simulation of negative bodies, zero agents or NaN percentiles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks import loops
from simulator.cli import main as simulate
from simulator.experiment import Workload
from simulator.venue import load_venue

BAD_WORKLOADS = [
    ({"agents": 0}, "agents"),
    ({"envs": 0}, "envs"),
    ({"jobs": 0}, "jobs"),
    ({"callers": 0}, "callers"),
    ({"body_s": -1.0}, "body_s"),
    ({"body_s": float("nan")}, "body_s"),
    ({"think_s": -0.5}, "think_s"),
    ({"rate": 0.0}, "rate"),
    ({"duration_s": float("inf")}, "duration_s"),
    ({"scale": 0.0}, "scale"),
    ({"gap_s": -1.0}, "gap_s"),
]


@pytest.mark.parametrize(("fields", "name"), BAD_WORKLOADS)
def test_a_workload_out_of_range_names_the_field(fields: dict[str, Any], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Workload("w-agent", **fields)


def test_edge_values_are_accepted() -> None:
    Workload("w-agent", agents=1, body_s=0.0, think_s=0.0, gap_s=0.0, envs=1, jobs=1)


def test_an_unknown_workload_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown workload 'w-nope'"):
        Workload("w-nope")


@pytest.mark.parametrize(
    ("flag", "name"), [("--agents=0", "agents"), ("--body=-2", "body_s"), ("--envs=0", "envs")]
)
def test_the_cli_exits_2_naming_the_bad_value(
    flag: str, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert simulate(["--repeats", "1", flag, "--json"]) == 2
    captured = capsys.readouterr()
    assert name in captured.err and captured.out == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--scale", "0"], "--scale must be positive"),
        (["--cap", "0"], "--cap must be at least 1"),
        (["--arms", ","], "--arms names no arm"),
        (["--arms", "reuse-on,bogus"], "unknown arm 'bogus'"),
    ],
)
def test_the_loops_benchmark_refuses_bad_arguments_before_starting_a_broker(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        loops.main(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("tick_s=0", "tick_s must be positive"),
        ("reconcile_s=0", "reconcile_s must be positive"),
        ("budget=0", "budget must be at least 1"),
        ("gpus_per_node=1", "gpus_per_node (1) must hold the budget's 2 GPUs"),
        ("pool.step=0", "step must be a whole number >= 1"),
        ("pool.min_count=3", "the floor min_count (3) is above the ceiling max_count (2)"),
        ("pool.idle_timeout_s=-1", "must be a finite number >= 0"),
    ],
)
def test_a_venue_the_loop_cannot_run_is_refused(
    setting: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert simulate(["--venue", "h200", "--repeats", "1", "--set", setting, "--json"]) == 2
    assert message in capsys.readouterr().err


def test_a_pool_that_can_never_place_a_job_is_an_error_not_a_number(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--venue", "prod-cpu", "--arms", "reuse-on", "--repeats", "1", "--json"]
    assert simulate([*argv, "--set", "pool.max_count=0"]) == 1
    captured = capsys.readouterr()
    assert "the simulated pool is stuck" in captured.err and captured.out == ""
    assert "budget cpu 0/16; pods none; jobs wait on cpu" in captured.err  # what holds, who waits


def test_calibrate_needs_two_pods_for_a_median_and_a_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        simulate(["calibrate", "--pods", "1", "--out", "/nonexistent/local.yaml"])
    assert (
        exc.value.code == 2 and "--pods and --burst must be at least 2" in capsys.readouterr().err
    )


def test_calibrate_into_a_new_file_writes_a_whole_venue(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Real local pods: the new file is the shipped local venue with the measured starts,
    contention and termination, and it loads."""
    out = tmp_path / "local-here.yaml"
    assert (
        simulate(["calibrate", "--pods", "2", "--burst", "2", "--rounds", "1", "--out", str(out)])
        == 0
    )
    venue = load_venue(str(out))
    assert venue.name == "local" and venue.budget == load_venue("local").budget
    assert 0 < venue.start_phases["spawn_to_healthz"].median < 30
    assert "measured" in venue.notes["termination"] and str(out) in capsys.readouterr().out
