"""Operator and developer routes: functions, logs, pools, metrics, probes, schema."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from functions.sdk import ApiError, ClientError, JobNotFinished
from gateway.auth import Role
from gateway.harness import kill_pods, start_broker
from pool_manager.backends.local import stop_pod
from tests.conftest import BEHAVIOURS, EXAMPLES, BrokerServer, wait_running


def test_functions_are_versioned_listed_described_and_deleted(
    broker_server: BrokerServer,
) -> None:
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        v1 = fp.deploy(EXAMPLES / "noop", name="temp-fn", sku="cpu", entrypoint="noop:noop")
        v2 = fp.deploy(EXAMPLES / "noop", name="temp-fn", sku="cpu", entrypoint="noop:noop")
        assert v2["version"] == v1["version"] + 1
        assert "temp-fn" in {f["name"] for f in fp.functions()}
        resp = fp._http.delete("/v1/functions/temp-fn")
        assert resp.status_code == 200
        assert "temp-fn" not in {f["name"] for f in fp.functions()}
    with broker_server.client("ops-caller") as fp:
        try:
            fp.invoke("temp-fn", 1)
            raise AssertionError("a deleted function must not run")
        except ApiError as exc:
            assert exc.error_class == "NotFound"


def test_a_function_on_an_unknown_pool_is_rejected(broker_server: BrokerServer) -> None:
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        try:
            fp.deploy(EXAMPLES / "noop", name="nowhere", sku="tpu-v9", entrypoint="noop:noop")
            raise AssertionError("unknown sku accepted")
        except ApiError as exc:
            assert exc.status == 400 and exc.field == "sku"


def test_logs_of_a_job_are_kept_after_it_ends(broker_server: BrokerServer) -> None:
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="chatty", sku="cpu", entrypoint="behaviours:chatty")
    with broker_server.client("ops-logs") as fp:
        job = fp.invoke("chatty", 42)
        assert job["state"] == "SUCCEEDED"
        text = fp.logs(job["id"]).text
        followed = fp.logs(job["id"], follow=True).text
    assert "hello from the job: 42" in text
    assert "and a warning on stderr" in text
    assert followed == text


def test_a_log_of_several_chunks_is_served_whole_in_order(broker_server: BrokerServer) -> None:
    """The archive streams a long log 1 MiB at a time (never held whole in the broker)."""
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="shout", sku="cpu", entrypoint="behaviours:shout")
    with broker_server.client("ops-logs-long") as fp:
        job = fp.invoke("shout", 3_500_000)
        assert job["state"] == "SUCCEEDED", job
        text = fp.logs(job["id"]).text
    lines = text.splitlines()
    assert len(text) >= job["output"] and len(lines) == len(set(lines))
    assert [line[:13] for line in lines[:2]] == ["line 00000000", "line 00000001"]
    assert lines[-1].startswith(f"line {len(lines) - 1:08d}"), lines[-1][:20]


def test_the_logs_of_a_job_whose_pod_retires_after_it_are_kept(
    broker_server: BrokerServer,
) -> None:
    """A single-use pod (and a recycled one) is deleted after its job: only once its logs
    are archived, or the job's logs would go with it."""
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="chatty-once", sku="cpu", entrypoint="behaviours:chatty",
                  single_use=True)  # fmt: skip
    with broker_server.client("ops-logs-once") as fp:
        for n in (1, 2):
            job = fp.invoke("chatty-once", n)
            assert job["state"] == "SUCCEEDED" and job["acquisition"]["path"] == "single_use"
            assert f"hello from the job: {n}" in fp.logs(job["id"]).text


def test_following_logs_streams_a_running_jobs_output_before_it_ends(
    broker_server: BrokerServer,
) -> None:
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="ticker", sku="cpu", entrypoint="behaviours:ticker")
    with broker_server.client("ops-follow") as fp:
        job_id = fp.submit("ticker", 8)
        seen, state_while_streaming = "", None
        with fp._http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "1"}) as resp:
            for chunk in resp.iter_text():
                seen += chunk
                if "tick 1" in seen and state_while_streaming is None:
                    state_while_streaming = fp.job(job_id)["state"]
        final = fp.job(job_id)
    assert state_while_streaming == "RUNNING", "the first lines arrived while the job ran"
    assert final["state"] == "SUCCEEDED"
    assert [line for line in seen.splitlines() if line.startswith("tick")] == [
        f"tick {i}" for i in range(8)
    ], "every line exactly once, in order, across the live and archived parts"


def test_following_a_log_of_undecodable_bytes_keeps_every_line_once(
    broker_server: BrokerServer,
) -> None:
    """The agent sends a live log as text, each undecodable byte a 3-byte U+FFFD: the stream
    must go on from the agent's file offset, not from the length of the text it got (which
    skipped 4 bytes a line here, and lost lines where the archive took over)."""
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="ticker-bytes", sku="cpu",
                  entrypoint="behaviours:ticker_undecodable")  # fmt: skip
    with broker_server.client("ops-follow-bytes") as fp:
        job_id = fp.submit("ticker-bytes", 8)
        seen = ""
        with fp._http.stream("GET", f"/v1/jobs/{job_id}/logs", params={"follow": "1"}) as resp:
            for chunk in resp.iter_text():
                seen += chunk
        assert fp.job(job_id)["state"] == "SUCCEEDED"
    lines = seen.splitlines()
    assert "tick" in seen and all("tick" in line for line in lines), repr(seen)
    assert [line[line.index("tick") :] for line in lines] == [f"tick {i}" for i in range(8)]
    assert all(line.startswith("\ufffd\ufffd tick") for line in lines)


def test_the_log_is_there_as_soon_as_the_job_reads_as_ended(broker_server: BrokerServer) -> None:
    """A job reads as ended only once its log is archived: a read right after finds it."""
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="chatty-settle", sku="cpu", entrypoint="behaviours:chatty")
    with broker_server.client("ops-settle") as fp:
        for n in range(4):
            job_id = fp.submit("chatty-settle", n)
            while fp.job(job_id)["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                time.sleep(0.002)
            assert f"hello from the job: {n}" in fp.logs(job_id).text, n


def test_a_followed_log_starts_again_with_a_retried_attempt(broker_server: BrokerServer) -> None:
    """Followed across a retry (its pod lost), the log went on at the lost attempt's offset
    into the new attempt's log, skipping its first lines; the archive, the last attempt's
    log, is what a follower saw after the marker line."""
    with broker_server.client("ops-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="ticker-retry", sku="cpu",
                  entrypoint="behaviours:ticker_tagged", max_retries=1)  # fmt: skip
    with broker_server.client("ops-retry") as fp:
        job_id = fp.submit("ticker-retry", 30)
        wait_running(fp, job_id)
        got: list[bytes] = []

        def follow() -> None:  # its own client: an httpx client is not shared across threads
            with broker_server.client("ops-retry") as own:
                for chunk in own.iter_logs(job_id, follow=True):
                    got.append(chunk)

        follower = threading.Thread(target=follow)
        follower.start()
        deadline = time.monotonic() + 30
        while not got:  # the follower is into the first attempt's log
            assert time.monotonic() < deadline, "the follower read nothing"
            time.sleep(0.02)
        pod = fp.job(job_id)["attempts"][-1]["pods"][0]
        stop_pod(broker_server.home / "pods" / pod)
        follower.join(timeout=120)
        job = fp.job(job_id)
        archived = fp.logs(job_id).content
    assert job["state"] == "SUCCEEDED" and job["retries"] == 1, job
    followed = b"".join(got)
    first, marker, second = followed.partition(b"[firepool] attempt ")
    assert first and marker, followed[:200]
    second = second.split(b"\n", 1)[1]  # past the marker line
    assert second == archived, "after the marker: the last attempt's log, whole"
    lines = archived.decode().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [f"tick {i}" for i in range(30)]


def _wait_for_the_floor_pod(server: BrokerServer) -> None:
    """Until the shared broker's pool has its floor pod (a test run alone can come before the
    scaler made it)."""
    with server.client("ops-admin", Role.ADMIN) as fp:
        deadline = time.monotonic() + 30
        while not (report := fp.pools())["pools"]["cpu"]["pods"]:
            assert time.monotonic() < deadline, report
            time.sleep(0.05)


def test_pools_report_pods_queue_and_budgets_to_admins(broker_server: BrokerServer) -> None:
    _wait_for_the_floor_pod(broker_server)
    with broker_server.client("ops-admin", Role.ADMIN) as fp:
        report = fp.pools()
    cpu = report["pools"]["cpu"]
    assert cpu["floor"] == 1 and cpu["ceiling"] == 8
    assert report["budgets"]["cpu"]["budget"] == 16
    assert report["budgets"]["cpu"]["held_unit_seconds"] > 0  # the floor pod, since start


def test_probes_metrics_and_schema_answer(broker_server: BrokerServer) -> None:
    _wait_for_the_floor_pod(broker_server)
    url = broker_server.url
    assert httpx.get(f"{url}/healthz").json() == {"ok": True}
    assert httpx.get(f"{url}/readyz").status_code == 200
    metrics = httpx.get(f"{url}/metrics").text
    assert "firepool_pods{" in metrics and "firepool_jobs_total" in metrics
    held = [line for line in metrics.splitlines()
            if line.startswith('firepool_held_unit_seconds_total{accelerator="cpu"}')]  # fmt: skip
    assert len(held) == 1 and float(held[0].split()[-1]) > 0
    schema = httpx.get(f"{url}/openapi.json").json()
    assert "/v1/functions/{name}:invoke" in schema["paths"]


def test_a_queued_job_of_a_deleted_function_fails_NotFound_as_after_a_restart(
    tmp_path: Path,
) -> None:
    """Queued jobs of a deleted function fail ``NotFound``, as they would after a restart,
    instead of running on the deleted version (even once another caller registered the name
    again)."""
    catalog = "budgets: {cpu: 1}\npools:\n  cpu: {min_count: 0, max_idle_count: 0, max_count: 1}\n"
    server = start_broker(tmp_path / "home", catalog)
    try:
        with server.client("dev", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="busy", sku="cpu", entrypoint="behaviours:sleep")
            fp.deploy(BEHAVIOURS, name="doomed", sku="cpu", entrypoint="behaviours:sleep")
            blocker = fp.submit("busy", 2.0)
            wait_running(fp, blocker)
            queued = fp.submit("doomed", 0)
            assert fp.delete_function("doomed") == {"deleted": "doomed"}
            job = fp.wait(queued, timeout_s=60)
        assert (job["state"], job["error"]["class"]) == ("FAILED", "NotFound"), job
        assert job["attempts"] == [], "no attempt ran"
    finally:
        server.stop()
        kill_pods(tmp_path / "home")


def test_wait_that_runs_out_raises_instead_of_returning_an_unfinished_job(
    broker_server: BrokerServer,
) -> None:
    """``wait(timeout_s=1)`` returned a RUNNING job and raised nothing (new-user run)."""
    with broker_server.client("sdk-wait", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="sdk-sleep", sku="cpu", entrypoint="behaviours:sleep")
        job_id = fp.submit("sdk-sleep", 30)
        with pytest.raises(JobNotFinished) as ran_out:
            fp.wait(job_id, timeout_s=0.3)
        assert isinstance(ran_out.value, TimeoutError) and isinstance(ran_out.value, ClientError)
        assert ran_out.value.job["id"] == job_id
        assert ran_out.value.job["state"] in ("QUEUED", "RUNNING")
        fp.cancel(job_id)
        assert fp.wait(job_id)["state"] == "CANCELLED"
    assert issubclass(ApiError, ClientError)
