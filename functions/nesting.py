"""How deeply a job's JSON input and output may nest (lists and objects inside each other).

orjson, which every hop uses, refuses to serialize more than 254 nested levels, and the hops
wrap a job's payload deeper still (the attempt spec around its input, the agent's result
around its output). A payload accepted near that limit would fail at a later hop, with the
job already running on a leased pod. So the broker refuses an input, and the job runner an
output, that nests deeper than ``MAX_NESTING``: a 400 at submit, a ``FunctionError`` at
return (``pod_runtime/job_main.py`` applies the same limit without importing this module: a
job's own modules may be named like ours).
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_NESTING = 128
"""Deepest accepted payload: ``[]`` and ``{}`` are one level, ``[[1]]`` two."""

ORJSON_MAX_DEPTH = 254
"""The most nested levels ``orjson.dumps`` serializes (255 raises "Recursion limit")."""


def nests_deeper(value: Any, levels: int = MAX_NESTING, text: bytes | None = None) -> bool:
    """Whether ``value`` (JSON data) nests more than ``levels`` deep. ``text``: JSON that
    holds ``value`` (the request body it was decoded from); with at most ``levels`` opening
    brackets in it, ``value`` cannot nest deeper, which settles most payloads in
    nanoseconds. Otherwise it serializes ``value`` once inside ``ORJSON_MAX_DEPTH - levels``
    wrapping lists, in C: cheaper than a Python walk of a large payload, and exactly
    orjson's own notion of depth."""
    if text is not None and text.count(b"[") + text.count(b"{") <= levels:
        return False
    try:
        json_within(value, levels)
    except ValueError:
        return True
    return False


def json_within(value: Any, levels: int = MAX_NESTING) -> bytes:
    """``value`` serialized, as ``orjson.dumps`` would; ``ValueError`` if it nests more than
    ``levels`` deep or is not JSON data. One pass in C: ``value`` is serialized inside
    ``ORJSON_MAX_DEPTH - levels`` wrapping lists, which orjson refuses past its own depth
    limit, and the wrapping is cut off the text."""
    wraps = ORJSON_MAX_DEPTH - levels
    probe = value
    for _ in range(wraps):
        probe = [probe]
    try:
        text = orjson.dumps(probe)
    except orjson.JSONEncodeError as exc:
        raise ValueError(str(exc)) from None
    return text[wraps:-wraps]
