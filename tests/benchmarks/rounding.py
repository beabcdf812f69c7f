"""Checking a benchmark's printed ratio against its printed timings."""

from __future__ import annotations


def ratio_of_printed(
    ratio: float, num: float, den: float, step: float = 0.001, ratio_step: float = 0.001
) -> bool:
    """Whether ``ratio`` (printed rounded to ``ratio_step``) is the ratio of two timings that
    were printed as ``num`` and ``den`` rounded to ``step``: it lies between the ratios of the
    ends of their rounding intervals. (A fixed tolerance fails on short timings: a 0.050 s
    wall rounded to 0.001 s is known to 1%.)"""
    half = step / 2
    low, high = (num - half) / (den + half), (num + half) / (den - half)
    return low - ratio_step / 2 <= ratio <= high + ratio_step / 2
