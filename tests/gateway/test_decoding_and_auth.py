"""Strict decoding and token validation, as units."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import jwt
import pytest
from hypothesis import given
from hypothesis import strategies as st

from functions.errors import Forbidden, InvalidRequest, Unauthorized, UnknownField
from gateway.auth import Authenticator, Role
from gateway.decoding import INTEGER_RANGE, Field, decode, parse_json

FIELDS = {
    "input": Field((object,)),
    "priority": Field((int,), default=0),
    "timeout_s": Field((float,)),
    "tag": Field((str,), required=True),
}


def test_decode_fills_defaults_and_accepts_ints_as_numbers() -> None:
    out = decode(b'{"tag": "t", "timeout_s": 3}', FIELDS)
    assert out == {"input": None, "priority": 0, "timeout_s": 3.0, "tag": "t"}


def test_decode_takes_a_whole_number_written_as_a_float_as_an_integer() -> None:
    """JSON has one number type, and JSON Schema counts 5.0 as an integer."""
    out = decode(b'{"tag": "t", "priority": -114.0}', FIELDS)
    assert out["priority"] == -114 and isinstance(out["priority"], int)
    with pytest.raises(InvalidRequest, match="priority"):
        decode(b'{"tag": "t", "priority": 1.5}', FIELDS)


def test_integers_are_kept_exact_to_64_bits_and_wider_ones_refused_not_rounded() -> None:
    low, high = INTEGER_RANGE
    digits = "1234567890" * 3
    exact = parse_json(f'[{low}, {high}, "{digits}", 1.{digits}, {digits}e0]'.encode())
    assert exact[:3] == [low, high, digits] and all(isinstance(v, float) for v in exact[3:])
    for wide in (low - 1, high + 1, int("9" * 300)):
        with pytest.raises(InvalidRequest, match="send it as a string"):
            parse_json(b'{"input": {"id": %d}}' % wide)
    for body in (b"%d" % (high + 1), b"[ \n\t%d\r ]" % (low - 1), b'{"a":1,"b":%d}' % (high + 1)):
        with pytest.raises(InvalidRequest, match="send it as a string"):
            parse_json(body)
    # Where a long digit run is no integer: in a string that looks like JSON, in an exponent
    # or a fraction. Such bodies are kept as they are (a float literal is a float).
    looks_like_json = f'{{"s": "[{high + 1}, {low - 1}]"}}'
    assert parse_json(looks_like_json.encode()) == json.loads(looks_like_json)
    exponent, fraction = parse_json(b"[1e-%d, 0.%d]" % (high + 1, high + 1))
    assert exponent == 0.0 and fraction == float(f"0.{high + 1}")
    with pytest.raises(InvalidRequest, match="nests too deeply"):
        parse_json(b"[" * 1020 + str(high + 1).encode() + b"]" * 1020)


JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(2**62, 2**66)  # around both ends of the 64-bit range
    | st.integers(-(2**64), -(2**62))
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet='0123456789-.e"\\[]{} a'),  # digits inside strings too
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=12,
)


def _integers(value: Any) -> Iterator[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        yield value
    elif isinstance(value, (list, dict)):
        for item in value.values() if isinstance(value, dict) else value:
            yield from _integers(item)


@given(JSON_VALUES)
def test_a_body_decodes_exactly_as_written_or_is_refused_for_a_wide_integer(value: Any) -> None:
    """The invariant behind the 64-bit rule: no number is ever silently changed (an integer
    turned float compares equal to it, so the values are compared re-encoded, type and all)."""
    body = json.dumps({"input": value}).encode()
    low, high = INTEGER_RANGE
    if all(low <= i <= high for i in _integers(value)):
        assert json.dumps(parse_json(body)) == json.dumps(json.loads(body))
    else:
        with pytest.raises(InvalidRequest, match="send it as a string"):
            parse_json(body)


@pytest.mark.parametrize(
    ("body", "error", "field"),
    [
        (b'{"tag": "t", "extra": 1}', UnknownField, "extra"),
        (b'{"priority": 1}', InvalidRequest, "tag"),
        (b'{"tag": "t", "priority": true}', InvalidRequest, "priority"),
        (b'{"tag": 5}', InvalidRequest, "tag"),
    ],
)
def test_decode_names_the_bad_field(body: bytes, error: type, field: str) -> None:
    with pytest.raises(error) as info:
        decode(body, FIELDS)
    assert info.value.field == field


def test_decode_rejects_non_objects_and_bad_json() -> None:
    for body in (b"[1]", b"{", b'"x"'):
        with pytest.raises(InvalidRequest):
            decode(body, FIELDS)


def test_tokens_round_trip_with_role_and_are_cached() -> None:
    auth = Authenticator(b"k" * 32)
    token = auth.mint("alice", Role.DEPLOY, ttl_s=60)
    p = auth.authenticate(f"Bearer {token}")
    assert (p.caller, p.role) == ("alice", Role.DEPLOY)
    assert auth.authenticate(f"Bearer {token}") is p
    p.require(Role.INVOKE)
    with pytest.raises(Forbidden):
        p.require(Role.ADMIN)


def test_tokens_for_another_audience_or_key_are_refused() -> None:
    other = Authenticator(b"o" * 32).mint("eve")
    with pytest.raises(Unauthorized):
        Authenticator(b"k" * 32).authenticate(f"Bearer {other}")
    wrong_aud = Authenticator(b"k" * 32, audience="elsewhere").mint("eve")
    with pytest.raises(Unauthorized):
        Authenticator(b"k" * 32).authenticate(f"Bearer {wrong_aud}")


def test_an_expired_token_is_refused_even_when_it_was_cached() -> None:
    auth = Authenticator(b"k" * 32)
    token = auth.mint("bob", ttl_s=1)
    auth.authenticate(f"Bearer {token}")
    expires = jwt.decode(token, options={"verify_signature": False})["exp"]
    while time.time() < expires:  # a second at most: its lifetime is counted in whole seconds
        time.sleep(0.01)
    with pytest.raises(Unauthorized):
        auth.authenticate(f"Bearer {token}")
