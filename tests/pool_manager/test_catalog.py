"""The catalog: pools, budgets and per-caller limits read once, unknown keys rejected."""

from __future__ import annotations

import pytest

from functions.errors import InvalidRequest, UnknownField
from pool_manager.catalog import CallerLimits, Catalog


def test_caller_limits_are_read_with_per_caller_overrides() -> None:
    catalog = Catalog.from_mapping(
        {
            "pools": {"cpu": {}},
            "limits": {"max_pods": 4},
            "caller_limits": {"trainer": {"max_gpus": 16}},
        }
    )
    assert catalog.limits_for("alice") == CallerLimits(max_pods=4)
    assert catalog.limits_for("trainer") == CallerLimits(max_gpus=16)
    assert catalog.has_limits


def test_a_catalog_without_limits_checks_none() -> None:
    assert not Catalog.from_mapping({"pools": {"cpu": {}}}).has_limits


@pytest.mark.parametrize(
    "data",
    [
        {"pools": {"cpu": {}}, "limit": {}},
        {"pools": {"cpu": {}}, "limits": {"max_pod": 1}},
        {"pools": {"cpu": {"standby_per_active": 1}}},
    ],
)
def test_an_unknown_catalog_key_is_rejected_by_name(data: dict[str, object]) -> None:
    with pytest.raises(UnknownField):
        Catalog.from_mapping(data)


def test_an_unknown_tag_mode_is_rejected_with_the_choices() -> None:
    with pytest.raises(InvalidRequest, match="retire, switch, hint"):
        Catalog.from_mapping({"pools": {"cpu": {"tag_mode": "strict"}}})
    assert Catalog.from_mapping({"pools": {"cpu": {"tag_mode": "switch"}}}).pools["cpu"].tag_mode
