"""What a job record tells a caller (DESIGN "The public interface", paper A.6)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.auth import Role
from tests.conftest import BEHAVIOURS, BrokerServer, wait_running


@pytest.fixture(scope="module")
def behaviours(broker_server: BrokerServer) -> BrokerServer:
    with broker_server.client("deployer", Role.DEPLOY) as fp:
        for fn in ("fail", "exit3", "sleep", "whoami"):
            fp.deploy(
                BEHAVIOURS,
                name=fn,
                sku="cpu",
                entrypoint=f"behaviours:{fn}",
                timeout_s=30,
                max_retries=0,
            )
    return broker_server


def test_a_successful_job_shows_state_output_attempts_timings_and_acquisition(
    behaviours: BrokerServer,
) -> None:
    with behaviours.client("rec-frank") as fp:
        job = fp.invoke("whoami", None, lease_tag="x")
        again = fp.job(job["id"])
    assert job["state"] == "SUCCEEDED"
    assert job["output"]["caller"] == "rec-frank", "the verified caller identity is injected"
    assert job["exit_code"] == 0
    assert job["retries"] == 0
    assert job["error"] is None
    assert [a["id"] for a in job["attempts"]] == [f"{job['id']}:0"]
    assert job["attempts"][0]["pods"]
    assert job["acquisition"]["path"] in {"idle", "new", "warm"}
    if job["acquisition"]["path"] != "warm":
        assert job["acquisition"]["reason"], "a colder path says why"
    t = job["timings"]
    assert t["submitted"] <= t["started"] <= t["first_instruction"] <= t["finished"]
    assert again["state"] == "SUCCEEDED" and again["output"] == job["output"]


def test_a_raising_function_fails_with_FunctionError(behaviours: BrokerServer) -> None:
    with behaviours.client("rec-gina") as fp:
        job = fp.invoke("fail", {"x": 1})
    assert job["state"] == "FAILED"
    assert job["error"]["class"] == "FunctionError"
    assert "bad input" in job["error"]["message"]


def test_a_process_exit_fails_with_NonZeroExit_and_its_exit_code(
    behaviours: BrokerServer,
) -> None:
    with behaviours.client("rec-hank") as fp:
        job = fp.invoke("exit3", None)
    assert job["state"] == "FAILED"
    assert job["error"]["class"] == "NonZeroExit"
    assert job["exit_code"] == 3


def test_a_job_whose_dependencies_fail_has_no_exit_code(
    behaviours: BrokerServer, tmp_path: Path
) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("this is == not a requirement\n")
    with behaviours.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(
            BEHAVIOURS,
            name="baddeps",
            sku="cpu",
            entrypoint="behaviours:whoami",
            requirements=requirements,
            max_retries=0,
        )
    with behaviours.client("rec-ivy") as fp:
        job = fp.invoke("baddeps", None)
    assert job["state"] == "FAILED"
    assert job["error"]["class"] == "DependencyInstallFailed"
    assert "exit_code" not in job, "no process of the job ever exited"
    assert job["timings"]["first_instruction"] is None


def test_a_running_job_can_be_cancelled(behaviours: BrokerServer) -> None:
    with behaviours.client("rec-ivy") as fp:
        job_id = fp.submit("sleep", 30)
        wait_running(fp, job_id, timeout_s=30)
        fp.cancel(job_id)
        final = fp.wait(job_id, timeout_s=30)
    assert final["state"] == "CANCELLED"
    assert final["error"]["class"] == "Cancelled"
    assert final["timings"]["finished"] - final["timings"]["started"] < 20


def test_timeout_kills_the_job_and_reports_Timeout(behaviours: BrokerServer) -> None:
    with behaviours.client("rec-jack") as fp:
        job = fp.invoke("sleep", 20, timeout_s=0.5)
    assert job["state"] == "FAILED"
    assert job["error"]["class"] == "Timeout"
