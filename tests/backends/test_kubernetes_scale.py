"""``benchmarks.k8s_scale`` runs end to end on a few pods and prints one JSON object with
every number it promises; a bad rate is one argparse error."""

from __future__ import annotations

import json
import subprocess
import sys

from gateway.harness import REPO


def test_the_scale_benchmark_prints_its_numbers_beside_their_floors() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.k8s_scale", "--pods", "20", "--passes", "3",
         "--qps", "200", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, done.stdout
    result = json.loads(lines[0])
    assert result["pods"] == 20 and result["passes"] == 3
    for key in ("reconcile_pass_p50_s", "reconcile_pass_p99_s", "floor_bare_list_p50_s",
                "reconcile_p50_over_floor", "creates_per_s", "creates_over_limit",
                "broker_bytes_per_pod", "pod_json_bytes"):  # fmt: skip
        assert isinstance(result[key], int | float), key
    assert result["reconcile_pass_p50_s"] <= result["reconcile_pass_p99_s"]
    assert result["creates_over_limit"] > 0


def test_a_rate_of_zero_is_one_error_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.k8s_scale", "--qps", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--qps must be > 0" in done.stderr, done.stderr
