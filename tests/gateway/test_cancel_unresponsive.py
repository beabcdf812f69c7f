"""A caller's cancel still ends the job when the pod's agent does not answer it (a job can stop
its own agent), rather than leaving it RUNNING until its timeout plus grace. The attempt is
abandoned as cancelled and its pod deleted, never reused."""

from __future__ import annotations

import time

from gateway.auth import Role
from tests.conftest import BEHAVIOURS, BrokerServer, cancel_with_agent_stopped, wait_running
from tests.helpers import wait_at_agent


def test_a_cancel_its_agent_does_not_answer_ends_the_job_and_deletes_the_pod(
    broker_server: BrokerServer,
) -> None:
    with broker_server.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="sleeper", sku="cpu", entrypoint="behaviours:sleep")
    with broker_server.client("stopper") as fp:
        job_id = fp.submit("sleeper", 120, lease_tag="s", timeout_s=300)
        pod = wait_at_agent(broker_server.home, wait_running(fp, job_id))
        job, took = cancel_with_agent_stopped(fp, job_id, pod)
    assert job["state"] == "CANCELLED" and job["error"]["class"] == "Cancelled", job
    assert job["attempts"][-1]["error"]["class"] == "Cancelled", job["attempts"]
    assert took < 60, took  # not the job's 300 s timeout
    record = broker_server.home / "pods" / f"{pod}.json"
    deadline = time.monotonic() + 30
    while record.exists():  # deleted, never reused
        assert time.monotonic() < deadline, record.read_text()
        time.sleep(0.1)
