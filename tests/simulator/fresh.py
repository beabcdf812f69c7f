"""Run simulator code in a new interpreter: ``run_many`` forks only from a single-threaded
process, and a test worker may hold daemon threads other tests left (a fake pod's call that
ran past its timeout), where a fork test would test nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PRELUDE = """
import threading
assert threading.active_count() == 1, "run_many would not fork: this would test nothing"
"""


def in_a_fresh_process(code: str, setup: str = "") -> str:
    """What ``code`` (dedented, after ``setup``) printed, run in a new single-threaded
    interpreter at the repository's root; fails the test if it exits non-zero."""
    done = subprocess.run(
        [sys.executable, "-c", _PRELUDE + setup + textwrap.dedent(code)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout
