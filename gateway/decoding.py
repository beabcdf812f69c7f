"""Strict request decoding: unknown fields are rejected by name, types are checked.

A typo'd option must fail loudly rather than be ignored (paper App. A.6). Each route declares
its body as a mapping of field name to ``Field``; ``decode`` returns a plain dict holding only
declared fields (absent optional fields are filled with their default).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
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

_LONG_DIGIT_RUN = re.compile(rb"\d{19}")
"""Every integer outside ``INTEGER_RANGE`` is written with at least 19 digits."""


def parse_json(body: bytes) -> Any:
    """``body`` decoded, refused with ``InvalidRequest`` if it is not JSON or holds an
    integer outside ``INTEGER_RANGE``."""
    if not body:
        return {}
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None
    if _LONG_DIGIT_RUN.search(body):  # rare: only then is the exact check paid for
        _check_integer_literals(body)
    return data


def _check_integer_literals(body: bytes) -> None:
    """Read ``body`` again with the standard library's parser, which hands every integer
    literal (and nothing inside a string) to ``_exact_integer`` as written."""
    try:
        json.loads(body, parse_int=_exact_integer)
    except RecursionError:  # deeper than any field accepts (inputs nest at most 128 levels)
        raise InvalidRequest("body nests too deeply") from None


def _exact_integer(literal: str) -> int:
    low, high = INTEGER_RANGE
    digits = len(literal.lstrip("-"))  # JSON integers have no leading zeros
    if digits <= 20 and low <= (value := int(literal)) <= high:
        return value
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
