"""Crash recovery with a real broker process killed by SIGKILL (paper App. A.1, issue 4)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from broker.lifecycle import PodRecycler
from functions.sdk import ApiError
from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from pod_runtime.localpod import UnixHTTPConnection
from tests.conftest import BEHAVIOURS, cancel_with_agent_stopped, wait_running
from tests.helpers import agent_headers, threaded_broker, wait_at_agent

CATALOG = (
    "budgets: {cpu: 8}\n"
    "pools:\n"
    "  cpu: {min_count: 1, max_idle_count: 2, max_count: 4, idle_timeout_s: 300}\n"
)


@pytest.fixture
def crashy(tmp_path: Path) -> Iterator[list[BrokerServer]]:
    """A broker that tests may kill and restart; the list holds the current process."""
    home = tmp_path / "home"
    server = start_broker(home, CATALOG)
    with server.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="sleep", sku="cpu", entrypoint="behaviours:sleep", max_retries=0)
        fp.deploy(BEHAVIOURS, name="whoami", sku="cpu", entrypoint="behaviours:whoami")
    holder = [server]
    try:
        yield holder
    finally:
        holder[0].stop()
        kill_pods(home)


def _restart(holder: list[BrokerServer]) -> BrokerServer:
    old = holder[0]
    old.kill()
    port = int(old.url.rsplit(":", 1)[1])
    holder[0] = start_broker(old.home, CATALOG, port=port)
    return holder[0]


def test_a_reattached_job_whose_agent_falls_silent_can_still_be_cancelled(
    crashy: list[BrokerServer],
) -> None:
    """After a restart the broker re-attaches to the running attempt; a cancel its (stopped)
    agent does not answer abandons it there too, instead of waiting out its timeout."""
    with crashy[0].client("reattach-cancel") as fp:
        job_id = fp.submit("sleep", 120, timeout_s=300)
        pod = wait_at_agent(crashy[0].home, wait_running(fp, job_id))
    server = _restart(crashy)
    with server.client("reattach-cancel") as fp:
        job, took = cancel_with_agent_stopped(fp, job_id, pod)
    assert job["state"] == "CANCELLED" and job["error"]["class"] == "Cancelled", job
    # Abandoned by the cancel, not found lost by the re-attached wait's next poll (30 s on).
    assert job["attempts"][-1]["error"]["class"] == "Cancelled", job["attempts"]
    assert took < 60, took  # not the job's 300 s timeout


def test_a_kill_right_after_a_202_never_loses_the_job(crashy: list[BrokerServer]) -> None:
    server = crashy[0]
    token = server.token("kill-202")
    resp = httpx.post(
        f"{server.url}/v1/functions/sleep/jobs",
        json={"input": 0.1},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert resp.status_code == 202
    job_id = resp.json()["job_id"]
    server = _restart(crashy)
    with server.client("kill-202") as fp:
        job = fp.wait(job_id, timeout_s=60)
    assert job["state"] == "SUCCEEDED"


def test_a_job_running_through_a_crash_is_reattached_and_runs_once(
    crashy: list[BrokerServer],
) -> None:
    server = crashy[0]
    with server.client("reattach") as fp:
        job_id = fp.submit("sleep", 2.0)
        wait_at_agent(server.home, wait_running(fp, job_id, timeout_s=30))
    server = _restart(crashy)
    with server.client("reattach") as fp:
        job = fp.wait(job_id, timeout_s=60)
    assert job["state"] == "SUCCEEDED"
    assert job["output"] == "slept"
    assert len(job["attempts"]) == 1, "the attempt was re-attached, not run again"
    assert job["retries"] == 0


def test_owner_holds_survive_a_restart(crashy: list[BrokerServer]) -> None:
    server = crashy[0]
    with server.client("holder") as fp:
        first = fp.invoke("whoami", None, lease_tag="s")
    server = _restart(crashy)
    with server.client("holder") as fp:
        again = fp.invoke("whoami", None, lease_tag="s")
    with server.client("stranger") as fp:
        other = fp.invoke("whoami", None, lease_tag="s")
    assert again["acquisition"]["path"] == "warm"
    assert again["attempts"][0]["pods"] == first["attempts"][0]["pods"]
    assert other["attempts"][0]["pods"] != first["attempts"][0]["pods"]


def test_outputs_and_logs_expire_after_the_retention_with_an_Expired_answer(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    server = start_broker(
        home,
        CATALOG,
        extra_env={"FIREPOOL_RESULT_RETENTION_S": "0.5", "FIREPOOL_RETENTION_SWEEP_S": "0.2"},
    )
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="chatty", sku="cpu", entrypoint="behaviours:chatty")
        with server.client("forgetful") as fp:
            job = fp.invoke("chatty", 1)
            assert job["state"] == "SUCCEEDED"
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                resp = fp._http.get(f"/v1/jobs/{job['id']}")
                if resp.status_code == 410:
                    break
                time.sleep(0.1)
            assert resp.status_code == 410
            assert resp.json()["error"]["class"] == "Expired"
            assert fp._http.get(f"/v1/jobs/{job['id']}/logs").status_code == 410
            listed = {j["id"]: j for j in fp.jobs()}
            assert listed[job["id"]]["output_expired"] is True
            assert listed[job["id"]]["output"] is None
        assert not (home / "logs" / f"{job['id']}.log").exists()
    finally:
        server.stop()
        kill_pods(home)


def test_an_unclean_reset_retires_the_pod_and_the_next_job_gets_a_new_one(
    tmp_path: Path,
) -> None:
    """Every pod's first reset reports unclean (the agent's fault injection simulating a job
    process that survived SIGKILL): 5/5 jobs still succeed, each on a fresh pod, and no
    pod that reset unclean is ever used again."""
    home = tmp_path / "home"
    server = start_broker(home, CATALOG, extra_env={"FIREPOOL_AGENT_FAULT_UNCLEAN_RESETS": "1"})
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="whoami", sku="cpu", entrypoint="behaviours:whoami")
        with server.client("unlucky") as fp:
            jobs = [fp.invoke("whoami", None, lease_tag="same") for _ in range(5)]
        assert [j["state"] for j in jobs] == ["SUCCEEDED"] * 5
        pods = [j["attempts"][0]["pods"][0] for j in jobs]
        assert len(set(pods)) == 5, "a pod that reset unclean was reused"
        assert all(j["acquisition"]["path"] != "warm" for j in jobs)
        with server.client("ops", Role.ADMIN) as fp:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                alive = {p["name"] for p in fp._http.get("/v1/pools?pods=1").json()["pod_list"]}
                if not alive & set(pods):
                    break
                time.sleep(0.1)
        assert not alive & set(pods), "retired pods must be deleted"
        assert server.log().count("reset unclean") >= 5
    finally:
        server.stop()
        kill_pods(home)


def test_a_pod_lost_while_the_broker_was_down_spends_a_retry(
    crashy: list[BrokerServer],
) -> None:
    """A pod lost while the broker was down is a ``PodLost`` attempt, as it is while the
    broker runs: it spends a retry, so a ``max_retries=0`` function is not re-queued for free
    at every restart."""
    server = crashy[0]
    with server.client("lost-while-down") as fp:
        job_id = fp.submit("sleep", 30)  # deployed with max_retries=0
        wait_running(fp, job_id, timeout_s=30)
    server.kill()
    kill_pods(server.home)  # firepool down: the job's pod is gone
    server = _restart(crashy)
    with server.client("lost-while-down") as fp:
        job = fp.wait(job_id, timeout_s=60)
    assert job["state"] == "FAILED" and job["error"]["class"] == "PodLost", job
    assert len(job["attempts"]) == 1 and job["retries"] == 0, job["attempts"]


def test_a_log_not_yet_archived_when_the_broker_stopped_is_kept_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A log not yet archived when the broker stopped (a crash between a job's answer and
    the archiving) is archived by the next broker, which then acknowledges the attempt so the
    pod's agent drops its files. Here the archiving never runs in the first broker."""
    home = tmp_path / "home"
    monkeypatch.setattr(PodRecycler, "archive", lambda self, *args: None)
    with threaded_broker(home, keep_pods=True) as served:
        with served.client("dev", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="chatty", sku="cpu", entrypoint="behaviours:chatty")
        with served.client("talker") as fp:
            job = fp.invoke("chatty", "kept", lease_tag="t")
        pod = job["attempts"][-1]["pods"][0]
    monkeypatch.undo()
    assert job["state"] == "SUCCEEDED", job
    (home / "catalog.yaml").write_text("pools:\n  cpu: {min_count: 0, max_count: 4}\n")
    server = start_broker(home)
    try:
        with server.client("talker") as fp:
            text = b"".join(fp.iter_logs(job["id"]))
        endpoint = json.loads((home / "pods" / f"{pod}.json").read_text())["endpoint"]
        agent = UnixHTTPConnection(endpoint.removeprefix("unix:"), 10.0)
        try:
            agent.request("GET", "/healthz", headers=agent_headers(home, pod))
            held = json.loads(agent.getresponse().read())["attempts"]
        finally:
            agent.close()
    finally:
        server.stop()
        kill_pods(home)
    assert b"hello from the job: kept" in text, text
    assert held == [], "acknowledged once kept"


ONE_POD = "budgets: {cpu: 1}\npools:\n  cpu: {min_count: 0, max_idle_count: 0, max_count: 1}\n"


@pytest.mark.parametrize("case", ["single_use", "recycled"])
def test_a_pod_that_must_retire_after_its_job_still_does_after_a_crash(
    tmp_path: Path, case: str
) -> None:
    """A single-use job, or one that recycled its caller's pod of another session, running
    through a crash: the restarted broker still retires the pod after it (the mark is on the
    pod before the job runs, ``broker.pods.RETIRE_ANNOTATION``), so the caller's next job
    does not run on it ``warm``."""
    home = tmp_path / "home"
    server = start_broker(home, ONE_POD)
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="once", sku="cpu", entrypoint="behaviours:sleep",
                      single_use=True)  # fmt: skip
            fp.deploy(BEHAVIOURS, name="sleep", sku="cpu", entrypoint="behaviours:sleep")
        with server.client("alice") as fp:
            before = None
            if case == "recycled":
                before = fp.invoke("sleep", 0, lease_tag="s1")["attempts"][0]["pods"]
            job_id = fp.submit("once" if case == "single_use" else "sleep", 2.0, lease_tag="s2")
            wait_at_agent(home, wait_running(fp, job_id, timeout_s=30))
            assert fp.job(job_id)["acquisition"]["path"] == case
        server.kill()
        server = start_broker(home, ONE_POD, port=int(server.url.rsplit(":", 1)[1]))
        with server.client("alice") as fp:
            job = fp.wait(job_id, timeout_s=60)
            assert job["state"] == "SUCCEEDED" and len(job["attempts"]) == 1, job
            used = job["attempts"][0]["pods"]
            assert before is None or before == used
            after = fp.invoke("sleep", 0, lease_tag="s2")
        assert after["acquisition"]["path"] != "warm", after["acquisition"]
        assert after["attempts"][0]["pods"] != used, "the pod retired after its job"
    finally:
        server.stop()
        kill_pods(home)


def test_jobs_of_a_pool_removed_from_the_catalog_fail_after_the_restart(tmp_path: Path) -> None:
    """After a restart on a catalog without their pool, its queued jobs fail and new
    invokes are refused, rather than staying QUEUED for good."""
    home = tmp_path / "home"
    both = "pools:\n  cpu: {min_count: 0}\n  extra: {min_count: 0, max_count: 1}\n"
    server = start_broker(home, both)
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="on-extra", sku="extra", entrypoint="behaviours:sleep")
        with server.client("alice") as fp:
            running = fp.submit("on-extra", 30)
            wait_running(fp, running)
            queued = fp.submit("on-extra", 0)
        server.kill()
        server = start_broker(home, "pools:\n  cpu: {min_count: 0}\n",
                              port=int(server.url.rsplit(":", 1)[1]))  # fmt: skip
        with server.client("alice") as fp:
            for job_id in (running, queued):
                job = fp.wait(job_id, timeout_s=30)
                assert (job["state"], job["error"]["class"]) == ("FAILED", "NotFound"), job
                assert "'extra' is not in this broker's catalog" in job["error"]["message"]
            with pytest.raises(ApiError) as refused:
                fp.submit("on-extra", 0)
        assert (refused.value.status, refused.value.error_class) == (404, "NotFound")
    finally:
        server.stop()
        kill_pods(home)
