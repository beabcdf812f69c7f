"""A one-pod job is answered once its outcome is committed, before its pod's reset; the
caller's next step, sent the moment the answer arrives, waits for that reset and runs warm on
the same pod (``Tracker.resetting``): never on the pod before its reset, never on another pod
while its own resets."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.auth import Role
from tests.conftest import BEHAVIOURS, BrokerServer, running_broker


@pytest.fixture(scope="module")
def traces_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerServer]:
    """Spare idle pods on hand, so a caller that did not wait would find another pod."""
    catalog = "pools:\n  cpu: {min_count: 3, max_idle_count: 3}\n"
    with running_broker(tmp_path_factory.mktemp("traces"), catalog) as server:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="traces", sku="cpu", entrypoint="behaviours:leave_traces")
        yield server


def _steps(server: BrokerServer, caller: str, n: int) -> list[dict]:
    with server.client(caller) as fp:
        return [fp.invoke("traces", i, lease_tag=f"{caller}-episode") for i in range(n)]


def test_the_next_step_runs_warm_on_the_same_pod_after_its_reset(
    traces_broker: BrokerServer,
) -> None:
    jobs = _steps(traces_broker, "stepper", 12)
    assert [j["state"] for j in jobs] == ["SUCCEEDED"] * 12
    assert [j["output"]["found_previous"] for j in jobs] == [False] * 12, (
        "a step ran on its pod before the previous step's reset"
    )
    pods = {j["attempts"][-1]["pods"][0] for j in jobs}
    assert len(pods) == 1, f"a step ran on another pod while its own was resetting: {pods}"
    assert [j["acquisition"]["path"] for j in jobs[1:]] == ["warm"] * 11


def test_concurrent_callers_each_keep_their_own_pod(traces_broker: BrokerServer) -> None:
    with ThreadPoolExecutor(3) as pool:
        runs = list(pool.map(lambda c: _steps(traces_broker, c, 6), ["ann", "ben", "cat"]))
    for jobs in runs:
        assert all(not j["output"]["found_previous"] for j in jobs)
        assert len({j["attempts"][-1]["pods"][0] for j in jobs}) == 1
        assert [j["acquisition"]["path"] for j in jobs[1:]] == ["warm"] * 5
    owners = [next(iter({j["attempts"][-1]["pods"][0] for j in jobs})) for jobs in runs]
    assert len(set(owners)) == 3, "two callers shared a pod"
