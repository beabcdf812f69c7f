"""Template rollout and catalog reload on a running broker with real local pods (paper
App. C.3): a template change under steady load retires old pods at most ``drain_budget``
at a time, never past the pool's ceiling, and every job ends; a bad catalog is refused and
the old one serves on; SIGHUP reloads."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.auth import Role
from gateway.harness import kill_pods, start_broker
from tests.conftest import BEHAVIOURS, deploy_examples
from tests.helpers import ThreadedBroker, threaded_broker
from tests.rollout_load import Census, Load, wait


def _catalog(template: str, extra: str = "") -> str:
    return (
        "budgets: {cpu: 16}\n"
        "pools:\n"
        f"  cpu: {{min_count: 2, max_idle_count: 4, max_count: 4, drain_budget: 1,\n"
        f"        idle_timeout_s: 600, caller_hold_s: 600, template: {template}}}\n"
        f"{extra}"
    )


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[ThreadedBroker]:
    with threaded_broker(tmp_path / "home", _catalog("v1"), catalog_poll_s=0.1) as server:
        deploy_examples(server, {"noop": "noop:noop"})
        yield server


def test_a_template_change_under_load_drains_within_the_budget_and_ceiling(
    broker: ThreadedBroker,
) -> None:
    b = broker.broker
    census = Census(b.tracker)
    path = b.settings.catalog_path
    assert path is not None
    # As many callers as the ceiling: the pool is saturated, every pod busy or held for its
    # caller's next job, and no queued job is blocked at the ceiling long enough to break a
    # hold (a retirement that is not the rollout's: the budget bounds the rollout's own).
    load = Load(broker, callers=4)
    try:
        wait("jobs before the change", lambda: len(load.states) >= 30)
        old = {p.name for p in b.tracker.pods()}
        path.write_text(_catalog("v2"))  # what a ConfigMap update does to the mounted file
        wait("the reload", lambda: b.catalog.pools["cpu"].template == "v2", 10)
        at_change = len(load.states)
        wait(
            "every old pod gone",
            lambda: not old & {p.name for p in b.tracker.pods()},
            180,
        )
        wait("jobs on new pods", lambda: len(load.states) >= at_change + 30)
    finally:
        load.stop()
    pods = b.tracker.pods()
    assert pods and all(p.template == "v2" for p in pods)
    assert set(load.states) == {"SUCCEEDED"}, f"{len(load.states)} jobs: {set(load.states)}"
    most, most_retiring = census.peaks()
    assert most <= 4, f"{most} pods at once: past the ceiling 4"
    assert len(most_retiring) <= 1, f"{most_retiring} retiring at once: past the budget 1"
    assert b.catalog_reloader is not None and b.catalog_reloader.reloads == 1


def test_an_invalid_catalog_is_refused_and_the_old_one_serves_on(
    broker: ThreadedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    b = broker.broker
    path = b.settings.catalog_path
    assert path is not None and b.catalog_reloader is not None
    before = b.catalog
    path.write_text(_catalog("v1").replace("max_count: 4", "max_count: 4, colour: red"))
    wait("the refusal", lambda: b.catalog_reloader is not None and b.catalog_reloader.refused)
    assert b.catalog is before
    assert any(
        "catalog reload (the catalog file changed) refused" in r.getMessage()
        and "unknown key 'colour' in pool 'cpu'" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    with broker.client("after") as fp:
        assert fp.invoke("noop", 1)["state"] == "SUCCEEDED"


def test_removing_a_pool_with_jobs_waits_for_them(
    broker: ThreadedBroker, caplog: pytest.LogCaptureFixture
) -> None:
    """A catalog without ``spare`` while a job runs on ``spare`` and another waits for it
    is refused (logged once), and applied by the watch once both have ended (no job of the
    pool fails for the reload): its pool's pods are then deleted."""
    b = broker.broker
    path = b.settings.catalog_path
    assert path is not None and b.catalog_reloader is not None
    spare = "  spare: {min_count: 1, max_count: 1, idle_timeout_s: 600}\n"
    path.write_text(_catalog("v1", spare))
    wait("spare's pool", lambda: "spare" in b.catalog.pools, 10)
    with broker.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="sleepy", sku="spare", entrypoint="behaviours:sleep")
    with broker.client("alice") as fp:
        running, queued = fp.submit("sleepy", 2), fp.submit("sleepy", 1)
        wait("a job running", lambda: fp.job(running)["state"] == "RUNNING", 60)
        assert fp.job(queued)["state"] == "QUEUED"  # the pool's one pod is busy
        path.write_text(_catalog("v1"))
        wait("the refusal", lambda: b.catalog_reloader is not None and b.catalog_reloader.refused)
        assert "spare" in b.catalog.pools
        refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(refusals) == 1
        assert "pool 'spare' is removed but 1 of its jobs are queued" in refusals[0]
        wait("spare's removal", lambda: "spare" not in b.catalog.pools, 60)
        assert [fp.job(j)["state"] for j in (running, queued)] == ["SUCCEEDED", "SUCCEEDED"]
    wait("spare's pods gone", lambda: not [p for p in b.tracker.pods() if p.sku == "spare"], 60)
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1


def test_sighup_reloads_the_catalog(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_broker(home, _catalog("v1"), extra_env={"FIREPOOL_CATALOG_POLL_S": "0"})
    try:
        spare = "  spare: {max_count: 1}\n"
        changed = _catalog("v7", spare).replace("max_count: 4", "max_count: 3")
        (home / "catalog.yaml").write_text(changed)
        time.sleep(0.3)
        assert "catalog reloaded" not in server.log()  # no watch: only the signal reloads
        server.proc.send_signal(signal.SIGHUP)
        wait("the reload", lambda: "catalog reloaded (SIGHUP): pools cpu" in server.log(), 20)
        with server.client("admin", Role.ADMIN) as fp:
            pools = fp.pools()
        assert pools["pools"]["cpu"]["ceiling"] == 3
        # The served API document names the pools of the reloaded catalog.
        document = httpx.get(f"{server.url}/openapi.json", timeout=10).json()
        body = document["paths"]["/v1/functions"]["post"]["requestBody"]["content"]
        assert body["application/json"]["schema"]["properties"]["sku"]["enum"] == ["cpu", "spare"]
        assert server.proc.poll() is None
    finally:
        server.stop()
        kill_pods(home)
