"""What happens to jobs (README, "What happens to jobs"): at a shutdown, after ``firepool down``,
when their function is deleted, and to their logs. Each test here is one statement of that
section; the others are held elsewhere:

- a lost pod runs the job again within ``max_retries``, then ``PodLost``:
  ``tests/store/test_retry_policy.py::test_a_lost_pod_is_retried_within_the_budget``,
  ``tests/gateway/test_recovery.py::test_a_pod_lost_while_the_broker_was_down_spends_a_retry``;
- a function's own failure never runs again:
  ``tests/store/test_retry_policy.py::test_a_function_failure_is_never_retried``;
- an Idempotency-Key gives the same job for the same body, 422 for another, and a new job past
  its retention: ``tests/gateway/test_api_errors.py::
  test_idempotency_key_same_body_same_job_other_body_422``,
  ``tests/store/test_retention.py::test_an_idempotency_key_past_retention_creates_a_new_job``;
- ``firepool down`` is refused while a broker serves: ``tests/gateway/test_cli_and_demo.py::
  test_down_refuses_while_a_broker_serves_the_home_and_counts_running_pods``;
- stopping ``make run`` stops its pods: ``tests/gateway/test_demo_signals.py``;
- a job's log is its last attempt's: ``tests/gateway/test_operations.py::
  test_a_followed_log_starts_again_with_a_retried_attempt``, kept as long as its output:
  ``tests/gateway/test_recovery.py::
  test_outputs_and_logs_expire_after_the_retention_with_an_Expired_answer``; the cap at the
  agent, live and ended: ``tests/pod_runtime/test_log_cap.py``.

Real brokers (``firepool serve`` processes) over one state directory, stopped with SIGTERM as
an operator or a service manager stops them, and started again.
"""

from __future__ import annotations

import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from functions.sdk import ApiError
from gateway.auth import Role
from gateway.harness import REPO, BrokerServer, kill_pods, start_broker
from tests.conftest import BEHAVIOURS, wait_running

TWO_PODS = "budgets: {cpu: 2}\npools:\n  cpu: {min_count: 0, max_idle_count: 2, max_count: 2}\n"
ONE_POD = "budgets: {cpu: 1}\npools:\n  cpu: {min_count: 0, max_idle_count: 1, max_count: 1}\n"
DRAIN_S = 2.0


def stored_states(home: Path) -> dict[str, str]:
    """Each job's state as the job store holds it (read once no broker runs)."""
    with sqlite3.connect(home / "jobs.db") as db:
        return dict(db.execute("SELECT id, state FROM jobs").fetchall())


def terminate(server: BrokerServer) -> float:
    """SIGTERM the broker and wait for it to exit; the seconds that took."""
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(timeout=60)
    return time.monotonic() - start


def deploy_sleep(server: BrokerServer, *names: str, **options: Any) -> None:
    with server.client("deployer", Role.DEPLOY) as fp:
        for name in names:
            fp.deploy(BEHAVIOURS, name=name, sku="cpu", entrypoint="behaviours:sleep", **options)


def running_job(server: BrokerServer, caller: str, function: str) -> str:
    """The id of ``caller``'s running job of ``function``, once there is one."""
    deadline = time.monotonic() + 60
    with server.client(caller) as fp:
        while time.monotonic() < deadline:
            for job in fp.jobs(state="RUNNING"):
                if job["function"] == function:
                    return str(job["id"])
            time.sleep(0.05)
    raise AssertionError(f"no running job of {function}")


@dataclass
class Shutdown:
    """One broker stopped with SIGTERM while a short job ran, a long one ran through a sync
    invoke with an Idempotency-Key, and a third waited in the queue; then started again."""

    short: str = ""
    long: str = ""
    queued: str = ""
    refused_while_draining: bool = False
    stored: dict[str, str] = field(default_factory=dict)
    """The job store once the first broker had exited."""
    cut_invoke: BaseException | None = None
    after: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each job once the restarted broker ended it."""
    asked_again: dict[str, Any] = field(default_factory=dict)


@pytest.fixture(scope="module")
def shutdown(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shutdown]:
    home = tmp_path_factory.mktemp("shutdown") / "home"
    drain = {"FIREPOOL_DRAIN_S": str(DRAIN_S)}
    server = start_broker(home, TWO_PODS, extra_env=drain)
    seen = Shutdown()
    try:
        deploy_sleep(server, "sleep", "long", max_retries=0)
        with server.client("fate") as fp:
            seen.short = fp.submit("sleep", 2 * DRAIN_S / 3)
            wait_running(fp, seen.short)

            def invoke() -> None:
                try:
                    fp.invoke("long", 4 * DRAIN_S, idempotency_key="fate-long")
                except BaseException as exc:  # what the caller sees
                    seen.cut_invoke = exc

            caller = threading.Thread(target=invoke)
            caller.start()
            seen.long = running_job(server, "fate", "long")
            seen.queued = fp.submit("sleep", 0.1)
            assert fp.job(seen.queued)["state"] == "QUEUED", "both pods are busy"
        server.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + DRAIN_S
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{server.url}/healthz", timeout=0.5)
            except httpx.TransportError:
                seen.refused_while_draining = server.proc.poll() is None
                break
            time.sleep(0.02)
        server.proc.wait(timeout=60)
        caller.join(timeout=60)
        seen.stored = stored_states(home)
        server = start_broker(home, TWO_PODS, extra_env=drain)
        with server.client("fate") as fp:
            for job_id in (seen.short, seen.long, seen.queued):
                seen.after[job_id] = fp.wait(job_id, timeout_s=60)
            seen.asked_again = fp.invoke("long", 4 * DRAIN_S, idempotency_key="fate-long")
        yield seen
    finally:
        server.stop()
        kill_pods(home)


def test_a_shutdown_stops_taking_jobs_at_once_and_starts_no_queued_one(
    shutdown: Shutdown,
) -> None:
    assert shutdown.refused_while_draining, "new connections refused while running jobs drain"
    assert shutdown.stored[shutdown.queued] == "QUEUED", "a pod came free: no job started on it"


def test_a_job_that_ends_within_the_drain_is_recorded_by_the_stopping_broker(
    shutdown: Shutdown,
) -> None:
    assert shutdown.stored[shutdown.short] == "SUCCEEDED"


def test_a_job_running_past_the_drain_is_not_cancelled_and_the_next_broker_records_it_once(
    shutdown: Shutdown,
) -> None:
    assert shutdown.stored[shutdown.long] == "RUNNING", "left running in its pod"
    job = shutdown.after[shutdown.long]
    assert job["state"] == "SUCCEEDED" and job["output"] == "slept", job
    assert len(job["attempts"]) == 1 and job["retries"] == 0, "not run again"


def test_a_sync_invoke_cut_by_the_shutdown_gets_its_job_again_with_its_idempotency_key(
    shutdown: Shutdown,
) -> None:
    assert isinstance(shutdown.cut_invoke, (httpx.TransportError, ApiError)), shutdown.cut_invoke
    again = shutdown.asked_again
    assert again["id"] == shutdown.long and again["state"] == "SUCCEEDED", again
    assert len(again["attempts"]) == 1


def test_queued_jobs_stay_queued_through_a_shutdown_and_run_after_the_restart(
    shutdown: Shutdown,
) -> None:
    job = shutdown.after[shutdown.queued]
    assert job["state"] == "SUCCEEDED" and len(job["attempts"]) == 1, job


def test_after_firepool_down_a_job_left_running_runs_again_and_queued_jobs_are_untouched(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    server = start_broker(home, ONE_POD, extra_env={"FIREPOOL_DRAIN_S": "0.5"})
    try:
        deploy_sleep(server, "sleep")  # max_retries: the default, 2
        with server.client("downed") as fp:
            left = fp.submit("sleep", 4)
            wait_running(fp, left)
            queued = fp.submit("sleep", 0.1)
        terminate(server)
        assert stored_states(home) == {left: "RUNNING", queued: "QUEUED"}
        down = subprocess.run(
            [sys.executable, "-m", "gateway.cli", "down"],
            env={"FIREPOOL_HOME": str(home), "PATH": "/usr/bin:/bin"},
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert down.returncode == 0 and down.stdout.startswith("stopped 1 running pod"), down
        server = start_broker(home, ONE_POD)
        with server.client("downed") as fp:
            job = fp.wait(left, timeout_s=60)
            other = fp.wait(queued, timeout_s=60)
    finally:
        server.stop()
        kill_pods(home)
    assert job["state"] == "SUCCEEDED" and job["retries"] == 1, job
    assert [a["error"]["class"] for a in job["attempts"][:-1]] == ["PodLost"], job["attempts"]
    assert other["state"] == "SUCCEEDED" and len(other["attempts"]) == 1, other


@pytest.fixture
def one_pod(tmp_path: Path) -> Iterator[BrokerServer]:
    """A broker of one pod (per test: a caller's pod stays held for it)."""
    home = tmp_path / "home"
    server = start_broker(home, ONE_POD)
    try:
        yield server
    finally:
        server.stop()
        kill_pods(home)


def test_deleting_a_function_fails_its_queued_jobs_unrun_and_lets_running_ones_finish(
    one_pod: BrokerServer,
) -> None:
    deploy_sleep(one_pod, "doomed")
    with one_pod.client("deleter") as fp:
        running = fp.submit("doomed", 1.5)
        wait_running(fp, running)
        queued = fp.submit("doomed", 0.1)
        with one_pod.client("deployer", Role.DEPLOY) as owner:
            owner.delete_function("doomed")
        with pytest.raises(ApiError) as gone:
            fp.invoke("doomed", 0.1)
        finished, failed = fp.wait(running, timeout_s=60), fp.wait(queued, timeout_s=60)
    assert gone.value.status == 404 and gone.value.error_class == "NotFound"
    assert finished["state"] == "SUCCEEDED" and finished["output"] == "slept", finished
    assert failed["state"] == "FAILED" and failed["error"]["class"] == "NotFound", failed
    assert failed["attempts"] == [], "it never ran"


LOUD = """
import sys, time

def loud(mib):
    sys.stdout.write("the first line\\n")
    line = "x" * 1023 + "\\n"
    for _ in range(mib * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    time.sleep(1)
    raise RuntimeError("the last lines say why")
"""
MIB = 1024 * 1024


def test_a_log_over_64_mib_keeps_its_first_and_last_32_mib_with_one_line_saying_what_was_dropped(
    one_pod: BrokerServer, tmp_path: Path
) -> None:
    package = tmp_path / "loud"
    package.mkdir()
    (package / "loud.py").write_text(LOUD)
    with one_pod.client("deployer", Role.DEPLOY) as fp:
        fp.deploy(package, name="loud", sku="cpu", entrypoint="loud:loud", max_retries=0)
    with one_pod.client("reader") as fp:
        job_id = fp.submit("loud", 70)
        followed = b"".join(fp.iter_logs(job_id, follow=True))  # live, then the archive
        job = fp.wait(job_id, timeout_s=60)
        later = b"".join(fp.iter_logs(job_id))
    assert job["state"] == "FAILED", job
    assert followed == later, "the same bytes at the same offsets, live and archived"
    marker = re.search(rb"\n\[firepool\] (\d+) bytes of this log dropped here: (.*)\n", later)
    assert marker is not None, later[32 * MIB - 200 : 32 * MIB + 200]
    head, tail = later[: marker.start() + 1], later[marker.end() :]
    assert head.startswith(b"the first line\n")
    assert 32 * MIB - 4096 <= len(head) <= 32 * MIB and len(head) + len(tail) <= 64 * MIB
    assert marker[2] == f"a log over {64 * MIB} bytes keeps its start and its end".encode()
    written = len("the first line\n") + 70 * MIB + len(tail) - tail.index(b"Traceback")
    assert int(marker[1]) == written - len(head) - len(tail), "it says what it dropped"
    assert tail.startswith(b"x" * 1023 + b"\n"), "whole lines"
    assert tail.rstrip().endswith(b"RuntimeError: the last lines say why")
