"""Argument types the benchmarks share: a count of zero (``--pods 0``, ``--trials 0``) was a
traceback deep inside a run (new-user run); now argparse refuses it with one line, exit 2."""

from __future__ import annotations

import argparse

from gateway.cli import positive_int

__all__ = ["non_negative_int", "positive_int"]


def non_negative_int(text: str) -> int:
    """A whole number, 0 or more (a warm-up that may be skipped)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a whole number of 0 or more")
    return value
