"""``python -m benchmarks.bind --store s3 --json`` runs against its own SeaweedFS and prints one
JSON object with both medians and their ratio (the figure the issue's goal is about)."""

from __future__ import annotations

import json
import subprocess
import sys

from gateway.harness import REPO
from tests.functions.s3_server import S3Server


def test_the_s3_bind_benchmark_prints_one_object_with_its_floor_and_ratio(
    s3_server: S3Server,  # the server can start here (else skipped or failed, with the reason)
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bind", "--store", "s3", "--trials", "2", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["store"] == "s3" and result["trials"] == 2
    assert result["s3_bind_p50_ms"] > 0 and result["boto3_floor_p50_ms"] > 0
    ratio = result["s3_bind_p50_ms"] / result["boto3_floor_p50_ms"]
    assert abs(result["ratio"] - ratio) < 0.01, result
