"""The reuse rules, end to end over real HTTP with real pods (paper §5, DESIGN "The rules")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.auth import Role
from tests.conftest import BEHAVIOURS, BrokerServer, running_broker


def _pod(job: dict) -> str:
    return str(job["attempts"][-1]["pods"][0])


def test_same_caller_and_tag_within_the_hold_runs_warm_on_the_same_pod(
    broker_server: BrokerServer,
) -> None:
    with broker_server.client("warm-alice") as fp:
        first = fp.invoke("noop", {"step": 1}, lease_tag="session-a")
        second = fp.invoke("noop", {"step": 2}, lease_tag="session-a")
    assert first["state"] == second["state"] == "SUCCEEDED"
    assert second["output"] == {"step": 2}
    assert second["acquisition"] == {"path": "warm", "reason": None}
    assert _pod(second) == _pod(first)


@pytest.fixture(scope="module")
def no_spare_pods(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    """A pool that keeps no never-used pods, so a crossing job would otherwise wait."""
    catalog = "pools:\n  cpu: {min_count: 0, max_idle_count: 0}\n"
    with running_broker(tmp_path_factory.mktemp("nospare"), catalog) as server:
        yield server


def test_a_new_tag_runs_once_recycled_on_the_old_pod_which_then_retires(
    no_spare_pods: BrokerServer,
) -> None:
    with no_spare_pods.client("recycle-bob") as fp:
        old = fp.invoke("noop", 1, lease_tag="episode-1")
        crossing = fp.invoke("noop", 2, lease_tag="episode-2")
        after = fp.invoke("noop", 3, lease_tag="episode-2")
    assert crossing["acquisition"]["path"] == "recycled"
    assert crossing["acquisition"]["reason"]
    assert _pod(crossing) == _pod(old)
    assert _pod(after) != _pod(old), "the recycled pod must retire after its one job"


def test_three_concurrent_callers_never_get_a_pod_someone_else_used(
    broker_server: BrokerServer,
) -> None:
    callers = ["carol", "dave", "erin"]

    def loop(caller: str) -> list[tuple[str, str]]:
        with broker_server.client(caller) as fp:
            return [(caller, _pod(fp.invoke("noop", i, lease_tag=f"{caller}-t"))) for i in range(8)]

    with ThreadPoolExecutor(3) as pool:
        runs = [pair for result in pool.map(loop, callers) for pair in result]
    users: dict[str, set[str]] = {}
    for caller, pod in runs:
        users.setdefault(pod, set()).add(caller)
    shared = {pod: who for pod, who in users.items() if len(who) > 1}
    assert shared == {}, f"cross-caller reuse: {shared}"
    assert len(runs) == 24


@pytest.fixture(scope="module")
def switch_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    """``tag_mode: switch``: one live session per caller and queue (paper §5)."""
    catalog = "pools:\n  cpu: {min_count: 0, max_idle_count: 0, tag_mode: switch}\n"
    with running_broker(tmp_path_factory.mktemp("switch"), catalog) as server:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="sleep", sku="cpu", entrypoint="behaviours:sleep")
        yield server


def test_in_switch_mode_a_new_session_ends_every_pod_of_the_callers_prior_sessions(
    switch_pool: BrokerServer,
) -> None:
    with switch_pool.client("switch-ann") as fp, ThreadPoolExecutor(2) as pool:
        # Long enough that s2's new pod (no spare pods here) starts while s1 runs, even on a
        # loaded machine: s1 ending first would leave its pod held for s2 to recycle.
        long = pool.submit(fp.invoke, "sleep", 5, lease_tag="s1")
        deadline = time.monotonic() + 30
        while not fp.jobs(state="running"):  # s1 holds its pod: s2 needs a pod of its own
            assert time.monotonic() < deadline, "s1 never ran"
            time.sleep(0.02)
        s2 = fp.invoke("noop", 2, lease_tag="s2")
        s1 = long.result()
        crossing = fp.invoke("noop", 3, lease_tag="s3")
        again = fp.invoke("noop", 4, lease_tag="s1")
    held = {_pod(s1), _pod(s2)}
    assert len(held) == 2, "two sessions of one caller held a pod each"
    assert crossing["acquisition"]["path"] == "recycled" and _pod(crossing) in held
    # retire mode would run this warm on s1's pod; switch retired it when s3 began
    assert again["acquisition"]["path"] != "warm"
    assert _pod(again) not in held | {_pod(crossing)}
