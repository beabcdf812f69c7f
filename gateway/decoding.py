"""Strict request decoding: unknown fields are rejected by name, types are checked.

A typo'd option must fail loudly rather than be ignored (paper App. A.6). Each route declares
its body as a mapping of field name to ``Field``; ``decode`` returns a plain dict holding only
declared fields (absent optional fields are filled with their default).
"""

from __future__ import annotations

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


def parse_json(body: bytes) -> Any:
    if not body:
        return {}
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from None


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
