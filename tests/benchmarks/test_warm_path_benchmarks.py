"""The warm path's instruments (issue 25) run end to end at tiny sizes and print the figures
the issue is judged by, each beside its floor. Timings are never asserted: only that each
figure was measured (positive) and the ratios are the figures' own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from benchmarks.proc_cpu import process_cpu_s, tree_cpu_s
from benchmarks.verifier_fn.verifier import verify
from benchmarks.verifier_loop import checks
from gateway.harness import REPO
from tests.benchmarks.rounding import ratio_of_printed


def run_json(module: str, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args, "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_invoke_prints_the_warm_call_beside_its_floor_and_the_cpu_per_call() -> None:
    result = run_json(
        "invoke", "--calls", "10", "--rounds", "2", "--warmup", "1", "--new-pod-calls", "1"
    )
    for key in ("warm_p50_ms", "warm_p99_ms", "floor_p50_ms", "floor_p99_ms"):
        assert result[key] > 0, key
    # the ratios are of the unrounded timings, the timings printed rounded to 0.001 ms
    floor = result["floor_p50_ms"]
    for ratio, warm in (("warm_p50_over_floor_p50", "warm_p50_ms"),
                        ("warm_p99_over_floor_p50", "warm_p99_ms")):  # fmt: skip
        assert ratio_of_printed(result[ratio], result[warm], floor), (ratio, result)
    # 20 calls each: the agent, zygote and jobs (and the broker) spend at least a tick
    assert result["broker_cpu_ms_per_call"] > 0 and result["pod_cpu_ms_per_call"] > 0
    assert result["floor_cpu_ms_per_call"] > 0
    assert result["warm_calls"] == 20 and len(result["rounds"]) == 2
    assert result["warm_paths"] == {"warm": 20}


def test_the_verifier_loop_runs_every_check_both_ways_with_the_expected_verdicts() -> None:
    result = run_json("verifier_loop", "--checks", "8", "--rounds", "2", "--warmup", "1")
    assert result["checks"] == 8 and result["agents"] == 4
    assert len(result["firepool_walls_s"]) == 2 and len(result["local_walls_s"]) == 2
    walls = (result["firepool_wall_s"], result["local_wall_s"])  # rounded to 1 ms
    assert ratio_of_printed(result["wall_ratio"], *walls), result
    for key in ("firepool_call_p50_ms", "firepool_call_p99_ms", "local_call_p50_ms"):
        assert result[key] > 0, key
    assert {"overhead_p50_ms", "overhead_p99_ms", "load_average"} <= result.keys()


def test_the_backlog_benchmark_measures_broker_cpu_per_job_at_each_depth() -> None:
    result = run_json("backlog", "--depths", "4", "12", "--pods", "2", "--min-jobs", "10")
    assert result["backend"] == "fake"
    low, high = result["depths"]
    assert (low["jobs"], high["jobs"]) == (4, 12)
    assert (low["batches"], high["batches"]) == (3, 1)  # 4 jobs thrice reach 10; 12 at once
    assert high["broker_cpu_ms_per_job"] > 0
    assert {"not_succeeded", "wall_ms_per_job", "load_average"} <= high.keys()
    assert result["ratio"] == round(  # of the rounded figures, so exactly
        high["broker_cpu_ms_per_job"] / max(low["broker_cpu_ms_per_job"], 1e-9), 3
    )


def test_generated_checks_mix_right_and_wrong_solutions_and_the_verifier_tells_them_apart() -> None:
    work = checks(40)
    assert work == checks(40)  # deterministic
    assert 0 < sum(1 for _, right in work if not right) < len(work)
    for check, right in work:
        assert verify(check)["ok"] is right, check["solution"]


def test_a_tree_counts_the_cpu_of_a_child_it_reaped() -> None:
    me = os.getpid()
    before, own_before = tree_cpu_s([me]), process_cpu_s(me)
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\n"
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=60)  # reaped: cutime
    assert tree_cpu_s([me]) - before >= 0.25
    assert process_cpu_s(me) - own_before < 0.25  # a process's own CPU leaves its children out
