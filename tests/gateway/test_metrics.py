"""``/metrics`` tells the same story as the job records: a short agent loop over real HTTP
(a broker served by uvicorn on loopback, fake pods), then every counter and histogram count
is checked against ``GET /v1/jobs`` (acquisitions per pool and path, start latencies, job
outcomes), the pods the broker reports, and the store writer's own counters."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.service import Broker
from broker.settings import Settings
from broker.state_metrics import owner_state
from broker.telemetry import HANDOVER_PATHS, PrometheusTelemetry, Telemetry
from gateway.auth import Role
from pool_manager.model import PodInfo
from pool_manager.states import PodState
from tests.conftest import BEHAVIOURS, EXAMPLES
from tests.helpers import ThreadedBroker, threaded_broker
from tests.inprocess import inprocess_broker

CATALOG = (
    "budgets: {cpu: 8}\n"
    "pools:\n"
    "  cpu: {min_count: 0, max_idle_count: 2, max_count: 4}\n"
    "  batch: {accelerator: cpu, min_count: 1, max_idle_count: 1, max_count: 2}\n"
    "  tiny: {accelerator: cpu, min_count: 0, max_idle_count: 0, max_count: 1}\n"
)
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
Looped = tuple[ThreadedBroker, list[dict[str, Any]]]
"""The broker that served the loop, and its job records."""


def scrape(url: str) -> Samples:
    """Every sample of ``GET /metrics``, by name and sorted labels."""
    answer = httpx.get(f"{url}/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    out: Samples = {}
    for family in text_string_to_metric_families(answer.text):
        for sample in family.samples:
            out[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def by(samples: Samples, name: str, *keys: str) -> Counter[tuple[str, ...]]:
    """``name``'s samples (counts) summed by the labels ``keys``, zeros left out."""
    out: Counter[tuple[str, ...]] = Counter()
    for (n, ls), v in samples.items():
        if n == name and v:
            labels = dict(ls)
            out[tuple(labels[k] for k in keys)] += int(v)  # counts: whole numbers
    return out


def quiet(server: ThreadedBroker, timeout_s: float = 30.0) -> None:
    """Wait until no pod is starting or being deleted (creates and deletes settled)."""
    deadline = time.monotonic() + timeout_s
    with server.client("ops", Role.ADMIN) as fp:
        while True:
            report = fp._call("GET", "/v1/pools", "pools", params={"pods": "1"})
            moving = [p for p in report["pod_list"] if p["state"] in ("STARTING", "RETIRING")]
            if not moving:
                return
            assert time.monotonic() < deadline, moving
            time.sleep(0.05)


@pytest.fixture(scope="module")
def looped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Looped]:
    """A broker that served a short agent loop: two callers' sessions on ``cpu`` (new, warm,
    a session switch), a caller on ``batch`` (its floor pod, then warm), one failing job."""
    home = tmp_path_factory.mktemp("metrics")
    with threaded_broker(home, CATALOG, backend="fake") as server:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop")
            fp.deploy(EXAMPLES / "noop", name="noop-batch", sku="batch", entrypoint="noop:noop")
            fp.deploy(BEHAVIOURS, name="fail", sku="cpu", entrypoint="behaviours:fail",
                      max_retries=0)  # fmt: skip
        quiet(server)  # the batch pool's floor pod is up
        with server.client("alice", Role.INVOKE) as alice, server.client("bob") as bob:
            for i in range(3):
                assert alice.invoke("noop", i, lease_tag="s1")["state"] == "SUCCEEDED"
            assert alice.invoke("noop", 9, lease_tag="s2")["state"] == "SUCCEEDED"
            for i in range(2):
                assert bob.invoke("noop", i)["state"] == "SUCCEEDED"
                assert bob.invoke("noop-batch", i)["state"] == "SUCCEEDED"
            assert alice.invoke("fail", 1, lease_tag="s2")["state"] == "FAILED"
        quiet(server)
        with server.client("ops", Role.ADMIN) as ops:
            jobs = ops.jobs(limit=1000)
            ops.job(jobs[0]["id"])
        assert httpx.get(f"{server.url}/no/such/route").status_code == 404
        yield server, jobs


def test_acquisitions_per_pool_path_and_reason_match_the_job_records(looped: Looped) -> None:
    server, jobs = looped
    samples = scrape(server.url)
    records = Counter((j["sku"], j["acquisition"]["path"]) for j in jobs)
    assert by(samples, "firepool_acquisitions_total", "pool", "path") == records
    reasons = Counter(
        (j["sku"], j["acquisition"]["path"], j["acquisition"]["reason"] or "none") for j in jobs
    )
    assert by(samples, "firepool_acquisitions_total", "pool", "path", "reason") == reasons
    # the loop took more than one path, in both pools: the check above is not of one number
    assert {path for _, path in records} >= {"warm", "idle"} and len(records) >= 3


def test_start_latency_histograms_count_and_sum_each_job_once(looped: Looped) -> None:
    server, jobs = looped
    samples = scrape(server.url)
    started = [j for j in jobs if j["timings"]["first_instruction"] is not None]
    assert len(started) == len(jobs) == 9
    per_path = Counter((j["sku"], j["acquisition"]["path"]) for j in started)
    for name in ("firepool_submit_to_first_instruction_seconds",
                 "firepool_pod_to_first_instruction_seconds"):  # fmt: skip
        assert by(samples, f"{name}_count", "pool", "path") == per_path, name
    waited = sum(j["timings"]["first_instruction"] - j["timings"]["submitted"] for j in started)
    summed = total(samples, "firepool_submit_to_first_instruction_seconds_sum")
    assert summed == pytest.approx(waited, rel=1e-9, abs=1e-6)
    handovers = Counter(
        (j["sku"], j["acquisition"]["path"])
        for j in jobs
        if j["acquisition"]["path"] in HANDOVER_PATHS and j["retries"] == 0
    )
    assert by(samples, "firepool_handover_wait_seconds_count", "pool", "path") == handovers
    assert total(samples, "firepool_standby_promotions_total") == sum(
        j["acquisition"]["path"] == "standby" for j in jobs
    )


def test_jobs_resets_and_http_requests_are_counted_as_they_happened(looped: Looped) -> None:
    server, jobs = looped
    samples = scrape(server.url)
    submitted = Counter((j["sku"], "submitted") for j in jobs)
    ended = Counter((j["sku"], j["state"].lower()) for j in jobs)
    assert by(samples, "firepool_jobs_total", "pool", "event") == submitted + ended
    resets = Counter(j["sku"] for j in jobs for a in j["attempts"] for _ in a["pods"])
    assert by(samples, "firepool_pod_reset_seconds_count", "pool") == {
        (pool,): n for pool, n in resets.items()
    }
    assert total(samples, "firepool_pod_unclean_resets_total") == 0  # fake pods reset clean
    invoke = "/v1/functions/{name}:invoke"
    assert total(samples, "firepool_http_requests_total", route=invoke, status="200") == 9
    assert total(samples, "firepool_http_requests_total", route="/v1/jobs", status="200") == 1
    one = total(samples, "firepool_http_requests_total", route="/v1/jobs/{job_id}")
    assert one >= 1 and total(samples, "firepool_http_requests_total", route="unmatched") == 1
    assert not [ls for (n, ls) in samples if n == "firepool_http_requests_total"
                and any(jobs[0]["id"] in v for _, v in ls)]  # fmt: skip
    assert total(samples, "firepool_http_request_seconds_count", route=invoke) == 9


def test_pod_creates_deletes_and_readiness_match_the_pods_reported(looped: Looped) -> None:
    server, _ = looped
    samples = scrape(server.url)
    with server.client("ops", Role.ADMIN) as fp:
        report = fp._call("GET", "/v1/pools", "pools", params={"pods": "1"})
    live = Counter((p["sku"],) for p in report["pod_list"])
    creates = by(samples, "firepool_pod_creates_total", "pool")
    deletes = by(samples, "firepool_pod_deletes_total", "pool")
    ready = by(samples, "firepool_pod_create_to_ready_seconds_count", "pool")
    assert ready == creates  # fake pods all start
    assert creates - deletes == live  # quiet: every delete has landed
    assert ("batch", "warm_target") in by(samples, "firepool_pod_creates_total", "pool", "reason")
    pods = by(samples, "firepool_pods", "pool", "state", "role")
    assert pods == Counter((p["sku"], p["state"], p["role"]) for p in report["pod_list"])
    budget = report["budgets"]["cpu"]
    assert total(samples, "firepool_budget_used_units", accelerator="cpu") == budget["used"]
    assert total(samples, "firepool_budget_limit_units", accelerator="cpu") == 8


def test_store_commits_are_those_the_writer_counted(looped: Looped) -> None:
    server, _ = looped
    samples = scrape(server.url)
    stats = server.broker.jobs.writer_stats()
    assert total(samples, "firepool_store_commit_seconds_count") == stats.batches
    assert total(samples, "firepool_store_commit_batch_size_count") == stats.batches
    assert total(samples, "firepool_store_commit_batch_size_sum") == stats.writes


def test_held_capacity_split_adds_up_to_the_ledger_while_nothing_changes(looped: Looped) -> None:
    server, _ = looped
    quiet(server)
    before = scrape(server.url)
    time.sleep(0.3)
    after = scrape(server.url)
    name, exact = "firepool_pod_held_unit_seconds_total", "firepool_held_unit_seconds_total"
    split = total(after, name) - total(before, name)
    ledger = total(after, exact, accelerator="cpu") - total(before, exact, accelerator="cpu")
    assert split > 0.2 and split == pytest.approx(ledger, rel=0.05)
    states = {dict(ls)["owner_state"] for (n, ls) in after if n == name}
    assert states <= {"busy", "idle", "owner_held", "starting", "terminating"}
    assert "owner_held" in states  # the callers' pods are held for them


def test_queue_gauges_show_waiting_jobs_by_pool_and_queue(looped: Looped) -> None:
    server, _ = looped
    with server.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="sleep", sku="tiny", entrypoint="behaviours:sleep")
    with server.client("dave") as fp:
        blocker = fp.submit("sleep", 30)
        waiting = [fp.submit("sleep", 0, queue="batch") for _ in range(2)]
        deadline = time.monotonic() + 30
        while fp.job(blocker)["state"] != "RUNNING":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        time.sleep(0.05)
        samples = scrape(server.url)
        for job_id in [blocker, *waiting]:
            fp.cancel(job_id)
    assert total(samples, "firepool_queue_depth", pool="tiny", queue="batch") == 2
    assert total(samples, "firepool_queue_oldest_wait_seconds", pool="tiny", queue="batch") > 0.04


def test_metrics_off_records_no_events_but_keeps_the_state_gauges(tmp_path: Path) -> None:
    off = Broker(Settings(home=tmp_path / "off", backend="fake", metrics=False))
    on = Broker(Settings(home=tmp_path / "on", backend="fake"))
    assert type(off.telemetry) is Telemetry and isinstance(on.telemetry, PrometheusTelemetry)
    assert off.telemetry.registry is not on.telemetry.registry  # one registry per broker
    on.telemetry.acquired("cpu", "warm", None, 0.0)
    names = {m.name for m in off.telemetry.registry.collect()}
    assert "firepool_pods" in names and "firepool_acquisitions" not in names
    assert {m.name for m in on.telemetry.registry.collect()} >= names | {"firepool_acquisitions"}


async def test_a_broker_with_metrics_off_serves_the_state_gauges_only(tmp_path: Path) -> None:
    async with inprocess_broker(tmp_path, metrics=False) as fp:
        await fp.deploy(EXAMPLES / "noop", name="noop", entrypoint="noop:noop")
        answer = await fp.client.post(
            "/v1/functions/noop:invoke", json={"input": 1}, headers=fp.headers("alice")
        )
        assert answer.json()["state"] == "SUCCEEDED"
        text = (await fp.client.get("/metrics")).text
    names = {s.name for f in text_string_to_metric_families(text) for s in f.samples}
    assert {"firepool_pods", "firepool_held_unit_seconds_total", "firepool_ready"} <= names
    assert not [n for n in names if "acquisitions" in n or "http" in n or "first" in n]


@pytest.mark.parametrize(
    ("state", "hold_until", "expected"),
    [
        (PodState.IDLE, None, "idle"),
        (PodState.IDLE, 99.0, "idle"),
        (PodState.IDLE, 101.0, "owner_held"),
        (PodState.RUNNING, None, "busy"),
        (PodState.ASSIGNED, None, "busy"),
        (PodState.STARTING, None, "starting"),
        (PodState.RETIRING, None, "terminating"),
        (PodState.DELETED, None, None),
    ],
)
def test_a_pods_owner_state_is_what_its_units_are_held_for(
    state: PodState, hold_until: float | None, expected: str | None
) -> None:
    pod = PodInfo(name="cpu-1", sku="cpu", created=0.0, state=state, hold_until=hold_until)
    assert owner_state(pod, now=100.0) == expected
