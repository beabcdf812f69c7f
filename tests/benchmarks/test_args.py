"""A benchmark's counts are checked as argparse reads them: ``--pods 0`` and the like were a
traceback deep inside a run (new-user run)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.harness import REPO


@pytest.mark.parametrize(
    ("module", "flag", "value"),
    [
        ("tracker", "--pods", "0"),
        ("dispatch", "--jobs", "0"),
        ("reset", "--trials", "0"),
        ("invoke", "--calls", "-3"),
        ("invoke", "--warmup", "-1"),
        ("crash", "--kills", "0"),
        ("load", "--hold-s", "0"),
        ("load", "--callers", "-1"),
        ("invoke", "--rounds", "0"),
        ("verifier_loop", "--checks", "0"),
        ("backlog", "--pods", "0"),
    ],
)
def test_a_count_out_of_range_is_one_error_line_and_exit_2(
    module: str, flag: str, value: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", flag, value],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2, done
    assert f"argument {flag}:" in done.stderr and "Traceback" not in done.stderr, done.stderr
