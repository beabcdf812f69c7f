"""Functions ask for resources, not pools (paper §4): registration picks the smallest pool
of the catalog that fits, records it in the version, and refuses a request no pool fits by
the largest pool's name."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from functions.errors import InvalidRequest, UnknownField
from functions.resources import Resources
from functions.sdk import ApiError
from gateway.auth import Role
from pool_manager.catalog import Catalog, PoolSpec
from tests.helpers import ThreadedBroker, threaded_broker

THREE_CPU_POOLS = (
    "budgets: {cpu: 64, h200: 8}\n"
    "pools:\n"
    "  small: {units_per_pod: 1, max_count: 2}\n"
    "  medium: {units_per_pod: 4, max_count: 2}\n"
    "  large: {units_per_pod: 16, max_count: 2}\n"
)
CODE = "def double(x):\n    return 2 * x\n"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[ThreadedBroker]:
    with threaded_broker(tmp_path / "home", THREE_CPU_POOLS, backend="fake") as server:
        yield server


def test_functions_asking_1_3_and_9_cores_land_on_the_smallest_pool_that_fits(
    gateway: ThreadedBroker, tmp_path: Path
) -> None:
    (tmp_path / "calc.py").write_text(CODE)
    with gateway.client("deployer", Role.DEPLOY) as fp:
        landed = {
            cores: fp.deploy(
                tmp_path, name=f"cores-{cores}", resources={"cpu": cores},
                entrypoint="calc:double",
            )["sku"]
            for cores in (1, 3, 9)
        }  # fmt: skip
        assert fp.describe_function("cores-3")["sku"] == "medium", "recorded in the version"
        with pytest.raises(ApiError) as refused:
            fp.deploy(tmp_path, name="cores-100", resources={"cpu": 100}, entrypoint="calc:double")
    assert landed == {1: "small", 3: "medium", 9: "large"}
    assert refused.value.status == 400 and refused.value.field == "resources"
    assert "the largest CPU pool is 'large' (16 cores per pod)" in refused.value.message
    with gateway.client("caller") as fp:
        assert fp.function("cores-9").invoke(21) == 42, "its jobs run on the chosen pool"
        assert fp.function("cores-9").invoke_record(1)["sku"] == "large"


def test_a_function_names_a_pool_or_asks_for_resources_never_both(
    gateway: ThreadedBroker, tmp_path: Path
) -> None:
    (tmp_path / "calc.py").write_text(CODE)
    with gateway.client("deployer", Role.DEPLOY) as fp:
        with pytest.raises(ApiError) as both:
            fp.deploy(tmp_path, name="both", sku="small", resources={"cpu": 1},
                      entrypoint="calc:double")  # fmt: skip
        with pytest.raises(ApiError) as unknown:
            fp.deploy(tmp_path, name="odd", resources={"cores": 1}, entrypoint="calc:double")
    assert both.value.field == "sku"
    assert (unknown.value.error_class, unknown.value.field) == ("UnknownField", "resources.cores")


def _catalog(cores: list[int]) -> Catalog:
    pools = {f"p{i}": PoolSpec(sku=f"p{i}", units_per_pod=c) for i, c in enumerate(cores)}
    pools["gpu"] = PoolSpec(sku="gpu", accelerator="h200", units_per_pod=2)
    return Catalog(pools=pools)


@given(st.lists(st.integers(1, 64), min_size=1, max_size=6), st.floats(0.1, 80))
def test_the_chosen_pool_fits_and_no_smaller_one_does(cores: list[int], cpu: float) -> None:
    catalog = _catalog(cores)
    need = Resources(cpu=cpu)
    if math.ceil(cpu) > max(cores):
        with pytest.raises(InvalidRequest, match="the largest CPU pool"):
            catalog.smallest_fit(need)
        return
    chosen = catalog.smallest_fit(need)
    assert not chosen.is_gpu and chosen.units_per_pod >= math.ceil(cpu)
    assert chosen.units_per_pod == min(c for c in cores if c >= math.ceil(cpu))


def test_gpu_requests_round_up_within_their_accelerator_and_memory_counts() -> None:
    catalog = Catalog(
        pools={
            "h200-1": PoolSpec(sku="h200-1", accelerator="h200", units_per_pod=1),
            "h200-4": PoolSpec(sku="h200-4", accelerator="h200", units_per_pod=4),
            "a10-1": PoolSpec(sku="a10-1", accelerator="a10", units_per_pod=1),
            "cpu-small": PoolSpec(sku="cpu-small", units_per_pod=2, memory_limit_mb=1024),
            "cpu-big": PoolSpec(sku="cpu-big", units_per_pod=2, memory_limit_mb=8192),
        }
    )
    assert catalog.smallest_fit(Resources(gpus=2, accelerator="h200")).sku == "h200-4"
    assert catalog.smallest_fit(Resources(gpus=1, accelerator="a10")).sku == "a10-1"
    assert catalog.smallest_fit(Resources(cpu=2, memory_mb=2048)).sku == "cpu-big"
    with pytest.raises(InvalidRequest, match="no h100 GPU pool"):
        catalog.smallest_fit(Resources(gpus=1, accelerator="h100"))
    with pytest.raises(InvalidRequest, match="the largest h200 GPU pool is 'h200-4'"):
        catalog.smallest_fit(Resources(gpus=8, accelerator="h200"))


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"cpu": 0}, "resources.cpu"),
        ({"cpu": True}, "resources.cpu"),
        ({"memory": 1.5}, "resources.memory"),
        ({"gpus": -1}, "resources.gpus"),
        ({"gpus": 1, "accelerator": "cpu"}, "resources.accelerator"),
        ({}, "resources"),
    ],
)
def test_a_bad_resource_request_is_refused_by_name(raw: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        Resources.from_json(raw)
    assert refused.value.field == field
    with pytest.raises(UnknownField):
        Resources.from_json({"vram": 1})
