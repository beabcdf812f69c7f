"""What both clients put on the wire: JSON bodies, path segments, job requests and their
Idempotency-Keys. Pure functions; no I/O."""

from __future__ import annotations

import json
import urllib.parse
import uuid
from typing import Any

import orjson

from functions.errors import InvalidRequest

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED"})


def json_body(value: Any) -> bytes:
    """``value`` as the JSON the gateway takes, or ``InvalidRequest``: orjson writes NaN and
    Infinity as ``null`` (a function got ``{"x": None}`` for ``{"x": nan}``) and refuses an
    integer past 64 bits; the gateway refuses both over HTTP, so the SDK does not change
    them into something else on the way."""
    try:
        content = orjson.dumps(value)
    except TypeError as exc:  # an integer past 64 bits, or a type JSON has no form for
        raise InvalidRequest(f"the request cannot be sent as JSON: {exc}") from None
    if b"null" in content:  # only then may a NaN or Infinity have become one
        try:
            json.dumps(value, allow_nan=False)
        except ValueError:
            raise InvalidRequest(
                "the request holds NaN or Infinity, which JSON has no form for (send them "
                "as strings)"
            ) from None
        except TypeError:  # a type only orjson writes (datetime, dataclass): not checked
            pass
    return content


def segment(value: str) -> str:
    """``value`` as one path segment: percent-encoded, so a job id or name of
    ``../functions/x`` (or with ``?``) cannot walk to another route (``firepool cancel
    ../functions/NAME`` would delete the function NAME). ``.`` and ``..``, which no encoding
    keeps from being walked, are refused, and so is ``/`` (the server decodes ``%2F`` before
    it routes: ``ID%2Flogs`` would reach the logs route)."""
    if value in ("", ".", "..") or "/" in value:  # the server decodes %2F before routing
        raise InvalidRequest(f"{value!r} is not a job id or name")
    return urllib.parse.quote(value, safe="")


def job_request(
    input: Any,
    lease_tag: str | None = None,
    queue: str | None = None,
    priority: int | None = None,
    timeout_s: float | None = None,
    single_use: bool | None = None,
) -> bytes:
    """The body of an invoke or submit: the fields given, nothing for the rest."""
    body: dict[str, Any] = {"input": input}
    for key, value in (
        ("lease_tag", lease_tag),
        ("queue", queue),
        ("priority", priority),
        ("timeout_s", timeout_s),
        ("single_use", single_use),
    ):
        if value is not None:
            body[key] = value
    return json_body(body)


def check_key(key: str) -> str:
    """``key`` if an HTTP header can carry it, else ``InvalidRequest`` naming the header."""
    if not key.isascii() or not key.isprintable():
        raise InvalidRequest("an Idempotency-Key is printable ASCII", field="Idempotency-Key")
    return key


def new_key() -> str:
    """A fresh Idempotency-Key: one per logical call, the same on each of its retries."""
    return f"sdk-{uuid.uuid4().hex}"
