"""Outputs of a given size for ``benchmarks.big_output``."""


def nested(n: int | str) -> list[list[int]]:
    """``n`` one-element lists: 4 bytes of JSON each, some 70 bytes of Python objects."""
    return [[0]] * int(n)
