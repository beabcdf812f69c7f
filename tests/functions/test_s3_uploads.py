"""Direct uploads' pure parts: how a package is cut into parts, and the broker's upload
tickets (signed, bound to one digest and caller, expiring)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.package_uploads import Ticket, Tickets
from functions.errors import Expired, Forbidden
from functions.stores.s3 import MIN_PART_BYTES
from functions.stores.s3_uploads import MAX_PARTS, part_plan

MiB = 1024 * 1024


@given(
    size=st.integers(min_value=0, max_value=600 * 1024 * MiB),
    part_bytes=st.integers(min_value=MIN_PART_BYTES, max_value=512 * MiB),
)
def test_parts_cover_the_package_once_in_order_within_s3s_limits(
    size: int, part_bytes: int
) -> None:
    plan = part_plan(size, part_bytes)
    assert plan[0][0] == 0
    assert sum(length for _, length in plan) == size
    for (offset, length), (after, _) in itertools.pairwise(plan):
        assert offset + length == after  # contiguous, no overlap
        assert length >= MIN_PART_BYTES  # every part but the last
    assert len(plan) <= MAX_PARTS
    assert (len(plan) == 1) == (size <= part_bytes)


TICKET = Ticket("a" * 64, 10, "alice", "uploads/" + "a" * 64 + "/t0", None, 2_000)


def test_a_ticket_reads_back_as_issued_until_it_expires() -> None:
    tickets = Tickets(b"k" * 32)
    text = tickets.issue(TICKET)
    assert tickets.read(text, now=1_999) == TICKET
    with pytest.raises(Expired):
        tickets.read(text, now=2_001)


@pytest.mark.parametrize("change", [{"size": 10**9}, {"caller": "mallory"}, {"expires": 10**10}])
def test_a_ticket_changed_in_any_field_or_signed_by_another_key_is_forbidden(
    change: dict[str, object],
) -> None:
    tickets = Tickets(b"k" * 32)
    body, _, signature = tickets.issue(TICKET).partition(".")
    forged_body = tickets.issue(dataclasses.replace(TICKET, **change)).partition(".")[0]  # type: ignore[arg-type]
    with pytest.raises(Forbidden):
        tickets.read(f"{forged_body}.{signature}", now=0)
    with pytest.raises(Forbidden):
        Tickets(b"other key" * 4).read(f"{body}.{signature}", now=0)
