"""Multi-pod jobs end to end: all-or-nothing claims, rank env that users cannot override."""

from __future__ import annotations

from gateway.auth import Role
from tests.conftest import BEHAVIOURS, BrokerServer


def test_a_gang_runs_on_distinct_pods_with_rank_env_the_user_cannot_override(
    broker_server: BrokerServer,
) -> None:
    with broker_server.client("gang-dev", Role.DEPLOY) as fp:
        fp.deploy(
            BEHAVIOURS,
            name="ranks",
            sku="cpu",
            entrypoint="behaviours:ranks",
            pods=2,
            env={"RANK": "7", "WORLD_SIZE": "99", "MY_SETTING": "x"},
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
