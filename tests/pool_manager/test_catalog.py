"""The catalog: pools, budgets and per-caller limits read once, unknown keys rejected."""

from __future__ import annotations

from pathlib import Path

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


@pytest.mark.parametrize(
    ("pool", "field"),
    [
        ({"step": 0}, "step"),
        ({"units_per_pod": 0}, "units_per_pod"),
        ({"max_count": -1}, "max_count"),
        ({"min_count": 9, "max_count": 8}, "min_count"),
        ({"max_idle_count": "2"}, "max_idle_count"),
        ({"min_count": True}, "min_count"),
        ({"idle_timeout_s": -5}, "idle_timeout_s"),
        ({"idle_timeout_s": float("nan")}, "idle_timeout_s"),
        ({"caller_hold_s": "1m"}, "caller_hold_s"),
        ({"hold_min_tenure_s": -1}, "hold_min_tenure_s"),
        ({"standbys_per_active": 3}, "standbys_per_active"),  # a CPU pool has no GPU
        ({"pids_limit": 0}, "pids_limit"),
        ({"tmpfs_mb": 0}, "tmpfs_mb"),
        ({"tmpfs_mb": "1G"}, "tmpfs_mb"),
        ({"zygote": "yes"}, "zygote"),
        ({"preload": "numpy"}, "preload"),
        ({"preload": [1, None]}, "preload"),
        ({"preload": ["numpy; import os"]}, "preload"),
        ({"accelerator": 5}, "accelerator"),
        ({"accelerator": ""}, "accelerator"),
        ({"accelerator": "H200"}, "accelerator"),
        ({"template": ["a"]}, "template"),
    ],
)
def test_a_knob_out_of_range_or_of_the_wrong_type_is_named(
    pool: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidRequest) as exc:
        Catalog.from_mapping({"pools": {"cpu": pool}})
    assert exc.value.field == field and field in exc.value.message


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"pools": ["cpu"]}, "pools"),
        ({"pools": {"cpu": 5}}, "pool 'cpu'"),
        ({"pools": {"cpu": {}}, "budgets": {"cpu": "many"}}, "budgets.cpu"),
        ({"pools": {"cpu": {}}, "limits": {"max_pods": "x"}}, "limits.max_pods"),
        ({"pools": {"cpu": {}}, "gpus": {"h200": 5}}, "gpus.h200"),
    ],
)
def test_a_section_of_the_wrong_shape_is_named(data: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        Catalog.from_mapping(data)
    assert exc.value.field == field


@pytest.mark.parametrize("name", ["zz/../../fpadv3", "", "CPU", "a b", "-x", "x" * 64])
def test_a_pool_name_that_would_leave_its_place_in_a_path_is_refused(name: str) -> None:
    """Pool names become parts of pod names and cgroup paths: ``zz/../../fpadv3`` put a
    pool's cgroups at the root of the host's cgroup tree (adversarial run)."""
    with pytest.raises(InvalidRequest) as exc:
        Catalog.from_mapping({"pools": {name: {}}})
    assert exc.value.field == "sku"


@pytest.mark.parametrize(
    ("budgets", "pools", "starved"),
    [
        ({"cpu": 1}, {"a": {"min_count": 1}, "b": {}}, "b"),
        ({"h200": 2}, {"g": {"accelerator": "h200", "units_per_pod": 4}}, "g"),
        ({"h200": 2}, {"g": {"accelerator": "h200", "min_count": 3, "max_count": 4}}, "g"),
        ({"cpu": 4}, {"a": {"min_count": 2, "units_per_pod": 2}, "b": {}}, "b"),
    ],
)
def test_a_pool_that_could_never_place_a_pod_is_refused(
    budgets: dict[str, int], pools: dict[str, object], starved: str
) -> None:
    """Budget 1, pool ``a`` with a floor of 1: pool ``b``'s jobs queued forever beside the
    idle floor pod (adversarial run, 4 of 4)."""
    with pytest.raises(InvalidRequest) as exc:
        Catalog.from_mapping({"budgets": budgets, "pools": pools})
    assert exc.value.field == f"pools.{starved}", exc.value.message


def test_floors_that_leave_room_for_every_pool_are_accepted() -> None:
    catalog = Catalog.from_mapping(
        {"budgets": {"cpu": 2}, "pools": {"a": {"min_count": 1}, "b": {"min_count": 1}}}
    )
    assert set(catalog.pools) == {"a", "b"}


def test_the_edges_of_every_range_are_accepted() -> None:
    spec = Catalog.from_mapping(
        {"pools": {"g": {"accelerator": "h200", "min_count": 0, "max_count": 0, "step": 1,
                         "idle_timeout_s": float("inf"), "caller_hold_s": 0,
                         "standbys_per_active": 3}}}
    ).pools["g"]  # fmt: skip
    assert spec.max_count == 0 and spec.hold_s == 0


def test_a_catalog_file_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "catalog.yaml"
    path.write_text("pools:\n  cpu: {step: 0}\n")
    with pytest.raises(InvalidRequest, match=f"{path}: pool 'cpu': step"):
        Catalog.load(path)
    path.write_text("pools: [1, 2\n")
    with pytest.raises(InvalidRequest, match="not valid YAML"):
        Catalog.load(path)
    path.write_text("- cpu\n")
    with pytest.raises(InvalidRequest, match="a catalog is a mapping, not list"):
        Catalog.load(path)


def test_a_catalog_that_is_not_yaml_is_one_line_with_its_place(tmp_path: Path) -> None:
    """PyYAML's own message is seven lines (new-user adversarial run)."""
    path = tmp_path / "catalog.yaml"
    path.write_text("pools:\n  cpu: {min_count: 1\n")
    with pytest.raises(InvalidRequest) as exc:
        Catalog.load(path)
    assert "\n" not in exc.value.message
    assert exc.value.message.startswith(f"{path}: not valid YAML (line 3, column 1): ")
