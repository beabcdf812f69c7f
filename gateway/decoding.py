"""Strict request decoding: unknown fields are rejected by name, types are checked.

A typo'd option must fail loudly rather than be ignored (paper App. A.6). Each route declares
its body as a mapping of field name to ``Field``; ``decode`` returns a plain dict holding only
declared fields (absent optional fields are filled with their default).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from functions.errors import InvalidRequest, UnknownField

_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    dict: "an object",
    list: "a list",
}


@dataclass(frozen=True, slots=True)
class Field:
    types: tuple[type, ...]
    required: bool = False
    default: Any = None
    nullable: bool = True

    def check(self, name: str, value: Any) -> Any:
        if value is None:
            if self.nullable and not self.required:
                return self.default
            raise InvalidRequest(f"{name} must not be null", field=name)
        if object in self.types:
            return value
        # bool is an int subclass: never accept it where a number is meant
        if isinstance(value, bool) and bool not in self.types:
            raise InvalidRequest(f"{name} must be {self._expected()}", field=name)
        if float in self.types and isinstance(value, int):
            return float(value)
        if int in self.types and isinstance(value, float) and value.is_integer():
            return int(value)  # JSON has one number type: 5.0 is the integer 5
        if not isinstance(value, self.types):
            raise InvalidRequest(f"{name} must be {self._expected()}", field=name)
        return value

    def _expected(self) -> str:
        return " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in self.types)


INTEGER_RANGE = (-(2**63), 2**64 - 1)
"""The integers a body may hold. orjson, which every hop uses, reads a wider one as a float and
so silently drops its low digits; such a body is refused instead."""

_DIGITS_MASK = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
"""``bytes.translate`` table: each ASCII digit to ``0``, every other byte to a space."""

_LONG_RUN = b"0" * 19
"""Every integer outside ``INTEGER_RANGE`` is written with at least 19 digits."""

_CONTEXT = 64
"""Bytes looked at on each side of a long digit run (more whitespace than this: a candidate)."""


def parse_json(body: bytes) -> Any:
    """``body`` decoded, refused with ``InvalidRequest`` if it is not JSON or holds an
    integer outside ``INTEGER_RANGE``."""
    if not body:
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    # A scan in C settles almost every body (16 MB of JSON: ~9 ms, against ~105 ms for
    # orjson); the exact parse (slow: a Python call per integer) runs only when a candidate
    # is out of range, to refuse it or to find that it lay inside a string.
    mask = body.translate(_DIGITS_MASK)
    if _LONG_RUN in mask and any(not _fits(n) for n in _long_integer_candidates(body, mask)):
        _check_integer_literals(body)
    return data


def _long_integer_candidates(body: bytes, mask: bytes) -> Iterator[bytes]:
    """Each run of 19 or more digits (with its sign) that stands where a JSON integer can:
    after ``:``, ``[``, ``,`` or the start, before ``,``, ``]``, ``}`` or the end, whitespace
    aside. Every integer literal outside ``INTEGER_RANGE`` is one; one may also lie inside a
    string (``"[1234…]"``). ``mask``: ``body.translate(_DIGITS_MASK)``."""
    start = mask.find(_LONG_RUN)
    while start >= 0:
        end = mask.find(b" ", start)
        end = len(body) if end < 0 else end
        if body[start - 1 : start] == b"-":
            start -= 1
        before = body[max(0, start - _CONTEXT) : start].rstrip()
        after = body[end : end + _CONTEXT].lstrip()
        if (not before or before[-1:] in b":[,") and (not after or after[:1] in b",]}"):
            yield body[start:end]
        start = mask.find(_LONG_RUN, end)


def _fits(literal: bytes | str) -> bool:
    """Whether the integer ``literal`` lies in ``INTEGER_RANGE`` (read only when at most 21
    characters: a sign and 20 digits, JSON having no leading zeros; a longer one never fits,
    and ``int`` refuses one of 4,300 digits)."""
    low, high = INTEGER_RANGE
    return len(literal) <= 21 and low <= int(literal) <= high


def _check_integer_literals(body: bytes) -> None:
    """Read ``body`` again with the standard library's parser, which hands every integer
    literal (and nothing inside a string) to ``_exact_integer`` as written."""
    try:
        json.loads(body, parse_int=_exact_integer)
    except RecursionError:  # deeper than any field accepts (inputs nest at most 128 levels)
        raise InvalidRequest("body nests too deeply") from None


def _exact_integer(literal: str) -> int:
    if _fits(literal):
        return int(literal)
    low, high = INTEGER_RANGE
    digits = len(literal.lstrip("-"))
    shown = literal if len(literal) <= 40 else f"{literal[:20]}... ({digits} digits)"
    raise InvalidRequest(
        f"the integer {shown} is outside [{low}, {high}], the range JSON is carried in "
        "here (it would arrive as a float, its digits lost); send it as a string"
    )


def decode(body: bytes, fields: Mapping[str, Field]) -> dict[str, Any]:
    data = parse_json(body)
    if not isinstance(data, dict):
        raise InvalidRequest("body must be a JSON object")
    for name in data:
        if name not in fields:
            raise UnknownField(f"unknown field {name!r}", field=name)
    out: dict[str, Any] = {}
    for name, spec in fields.items():
        if name in data:
            out[name] = spec.check(name, data[name])
        elif spec.required:
            raise InvalidRequest(f"missing required field {name!r}", field=name)
        else:
            out[name] = spec.default
    return out


def string_map(name: str, value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidRequest(f"{name} must map strings to strings", field=name)
    return dict(value)
