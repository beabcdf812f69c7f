"""The broker's log lets an operator follow what happened: one line per request, per job event
(queued, started with its acquisition path and pods, ended with its state, error class and
duration), and at start and shutdown; never a token or a function's environment."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from functions.sdk import Client
from gateway.auth import Role
from gateway.harness import BrokerServer, kill_pods, start_broker
from tests.conftest import BEHAVIOURS, EXAMPLES, wait_running

STAMP = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "


def _line(server: BrokerServer, pattern: str, timeout_s: float = 10.0) -> str:
    """The first line of the broker's log matching ``pattern`` (after the timestamp), once
    it is there: a request's line is written once its answer has gone out."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(STAMP + pattern, server.log(), re.MULTILINE)
        if found:
            return found.group(0)
        assert time.monotonic() < deadline, f"no line {pattern!r} in:\n{server.log()[-3000:]}"
        time.sleep(0.02)


def test_the_start_line_names_the_address_home_store_backend_and_pools(
    broker_server: BrokerServer,
) -> None:
    home = broker_server.home
    _line(
        broker_server,
        re.escape(
            f"firepool.serve starting on {broker_server.url}: home {home}, store "
            f"sqlite:///{(home / 'jobs.db').resolve()}, backend local, pools cpu [1-8]"
        )
        + "$",
    )


def test_each_request_is_one_line_with_method_path_status_ms_and_caller(
    broker_server: BrokerServer,
) -> None:
    with broker_server.client("log-reader") as fp:
        fp.jobs(limit=5)
    _line(broker_server, r"firepool\.access GET /v1/jobs 200 \d+\.\d ms log-reader$")
    refused = httpx.get(f"{broker_server.url}/v1/functions/nothing-here?x=1",
                        headers={"Authorization": "Bearer not-a-jwt"})  # fmt: skip
    assert refused.status_code == 400  # the query is refused before the token is read
    _line(broker_server, r"firepool\.access GET /v1/functions/nothing-here 400 \d+\.\d ms -$")
    refused = httpx.get(f"{broker_server.url}/v1/functions/nothing-here",
                        headers={"Authorization": "Bearer not-a-jwt"})  # fmt: skip
    assert refused.status_code == 401
    _line(broker_server, r"firepool\.access GET /v1/functions/nothing-here 401 \d+\.\d ms -$")


def test_a_job_is_followed_from_queued_to_started_to_ended(broker_server: BrokerServer) -> None:
    with broker_server.client("log-dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="log-fail", sku="cpu", entrypoint="behaviours:fail",
                  max_retries=0)  # fmt: skip
    with broker_server.client("log-user") as fp:
        ok = fp.invoke("noop", 1)
        failed = fp.invoke("log-fail", 1)
    for job, function in ((ok, "noop"), (failed, "log-fail")):
        jid = job["id"]
        _line(broker_server, rf"firepool\.dispatcher job {jid} queued: {function} v1 for "
                             r"log-user on cpu$")  # fmt: skip
        pods = ",".join(job["attempts"][0]["pods"])
        path = job["acquisition"]["path"]
        _line(broker_server, rf"firepool\.dispatcher job {jid} started: attempt {jid}:0 on "
                             rf"{pods}, path {path}( \(\w+\))?$")  # fmt: skip
    _line(broker_server, rf"firepool\.dispatcher job {ok['id']} ended SUCCEEDED \d+\.\d{{3}} s "
                         r"after submission \(ran \d+\.\d{3} s\)$")  # fmt: skip
    _line(broker_server, rf"firepool\.dispatcher job {failed['id']} ended FAILED FunctionError "
                         r"\d+\.\d{3} s after submission \(ran \d+\.\d{3} s\)$")  # fmt: skip


def test_tokens_and_function_environments_stay_out_of_the_log(
    broker_server: BrokerServer,
) -> None:
    secret = "s3cret-value-of-the-env"
    deployer = broker_server.token("log-secret-dev", Role.DEPLOY)
    with Client(broker_server.url, deployer) as fp:
        fp.deploy(EXAMPLES / "noop", name="log-secret", sku="cpu", entrypoint="noop:noop",
                  env={"API_KEY": secret})  # fmt: skip
    with broker_server.client("log-secret-user") as fp:
        job = fp.invoke("log-secret", {"hello": "input-stays-out"})
    _line(broker_server, rf"firepool\.dispatcher job {job['id']} ended SUCCEEDED ")
    _line(broker_server, r"firepool\.access POST /v1/functions/log-secret:invoke 200 ")
    log = broker_server.log()
    assert deployer not in log and deployer.split(".")[2] not in log
    assert secret not in log and "input-stays-out" not in log


def test_shutdown_says_how_many_running_jobs_ended_within_the_drain(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_broker(home)
    try:
        with server.client("log-drain-dev", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="log-sleep", sku="cpu", entrypoint="behaviours:sleep")
        with server.client("log-drain") as fp:
            job_id = fp.submit("log-sleep", 1.0)
            wait_running(fp, job_id)
        server.stop()
        _line(server, r"firepool\.dispatcher stopping: 1 running job\(s\) get up to \d+ s to "
                      r"end; 0 queued stay in the store$")  # fmt: skip
        _line(server, rf"firepool\.dispatcher job {job_id} ended SUCCEEDED ")
        _line(server, r"firepool\.dispatcher stopped: 1 of 1 running job\(s\) ended within the "
                      r"drain, 0 still running; 0 queued$")  # fmt: skip
    finally:
        server.stop()
        kill_pods(home)
