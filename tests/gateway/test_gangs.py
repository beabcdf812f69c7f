"""Multi-pod jobs end to end: all-or-nothing claims, rank env that users cannot override."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from functions.sdk import ApiError
from gateway.auth import Role
from gateway.harness import kill_pods, start_broker
from tests.conftest import BEHAVIOURS, BrokerServer


def test_a_gang_runs_on_distinct_pods_with_rank_env_the_user_cannot_override(
    broker_server: BrokerServer,
) -> None:
    with broker_server.client("gang-dev", Role.DEPLOY) as fp:
        for reserved in ({"RANK": "7"}, {"WORLD_SIZE": "99"}):  # refused at registration
            with pytest.raises(ApiError) as refused:
                fp.deploy(BEHAVIOURS, name="ranks", sku="cpu", entrypoint="behaviours:ranks",
                          pods=2, env={**reserved, "MY_SETTING": "x"})  # fmt: skip
            assert (refused.value.status, refused.value.field) == (400, "env")
        fp.deploy(
            BEHAVIOURS,
            name="ranks",
            sku="cpu",
            entrypoint="behaviours:ranks",
            pods=2,
            env={"MY_SETTING": "x"},
        )
    with broker_server.client("gang-user") as fp:
        job = fp.invoke("ranks", None, lease_tag="g")
        again = fp.invoke("ranks", None, lease_tag="g")
    assert job["state"] == "SUCCEEDED", job["error"]
    pods = job["attempts"][0]["pods"]
    assert len(pods) == len(set(pods)) == 2
    out = job["output"]
    assert (out["RANK"], out["WORLD_SIZE"], out["LOCAL_RANK"]) == ("0", "2", "0")
    assert out["MASTER_ADDR"] and out["MASTER_PORT"]
    assert out["FIREPOOL_CALLER"] == "gang-user"
    assert again["acquisition"]["path"] == "warm"
    assert sorted(again["attempts"][0]["pods"]) == sorted(pods), "both pods return warm"


def test_a_gang_larger_than_its_callers_limit_is_refused_at_submit(tmp_path: Path) -> None:
    """A 2-pod gang for a ``max_pods: 1`` caller is refused at submit, not queued forever
    with two idle pods kept for it."""
    catalog = (
        "limits: {max_pods: 1}\ncaller_limits: {trainer: {max_pods: 2}}\n"
        "pools:\n  cpu: {min_count: 0, max_count: 2}\n"
    )
    server = start_broker(tmp_path / "home", catalog)
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="pair", sku="cpu", entrypoint="behaviours:ranks", pods=2)
        with server.client("alice") as fp, pytest.raises(ApiError) as refused:
            fp.submit("pair", None)
        assert (refused.value.status, refused.value.error_class) == (403, "Forbidden")
        assert "needs 2 pods at once" in refused.value.message
        assert "at most 1" in refused.value.message
        with server.client("trainer") as fp:
            assert fp.invoke("pair", None)["state"] == "SUCCEEDED"
    finally:
        server.stop()
        kill_pods(tmp_path / "home")


def test_a_gang_ends_when_one_rank_fails_not_when_the_others_finish(
    broker_server: BrokerServer,
) -> None:
    """Rank 1 fails at once: the gang ends then, rank 0 stopped, not when rank 0 would
    finish (60 s later)."""
    with broker_server.client("gang-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="rank-fails", sku="cpu",
                  entrypoint="behaviours:rank_one_fails", pods=2, max_retries=0)  # fmt: skip
    with broker_server.client("gang-failer") as fp:  # its pods are no other test's to recycle
        started = time.monotonic()
        job = fp.invoke("rank-fails", 60)
        took = time.monotonic() - started
    assert job["state"] == "FAILED", job
    assert job["error"]["class"] == "FunctionError" and "rank 1 gave up" in job["error"]["message"]
    assert took < 30, f"{took:.1f} s: rank 0 was not stopped"
