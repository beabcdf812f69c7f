"""A fault inside the broker itself must not strand a job on its leased pods.

The subprocess broker of the other tests cannot be made to fail from outside, so this one runs
the real broker in this process (uvicorn on a loopback port in a thread, real local pods, the
real SQLite store) and injects the fault by patching ``Executor.run`` for jobs whose input asks
for it. What is patched is the one call the dispatcher guards; everything around it is real.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy.exc import OperationalError

from broker import executor as executor_module
from broker.executor import Executor, Outcome
from functions.sdk import Client
from gateway.auth import Role
from gateway.harness import kill_pods, start_broker
from pod_runtime.localpod import UnixHTTPConnection
from tests.conftest import BEHAVIOURS, EXAMPLES, agent_pid, wait_running
from tests.helpers import (
    ThreadedBroker,
    agent_headers,
    make_wheel,
    threaded_broker,
    wait_at_agent,
)

FAULT = "raise inside the executor"


def test_a_broker_error_fails_the_job_as_internal_and_deletes_its_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = Executor.run

    async def run_or_fail(self: Executor, job: Any, *args: Any, **kwargs: Any) -> Outcome:
        if job.input == FAULT:
            raise RuntimeError("injected")
        return await real_run(self, job, *args, **kwargs)

    monkeypatch.setattr(Executor, "run", run_or_fail)
    with (
        threaded_broker(tmp_path / "home") as served,
        served.client("deployer", Role.DEPLOY) as fp,
    ):
        fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop")
        first = fp.invoke("noop", 1, lease_tag="t")
        failed = fp.wait(fp.submit("noop", FAULT, lease_tag="t"), timeout_s=30)
        after = fp.invoke("noop", 2, lease_tag="t")
    assert first["state"] == "SUCCEEDED", first
    assert failed["state"] == "FAILED", failed
    assert failed["error"]["class"] == "InternalError", failed
    assert "injected" in failed["error"]["message"]
    assert failed["attempts"][-1]["pods"] == first["attempts"][-1]["pods"]  # the warm pod
    # Its state unknown, that pod is deleted rather than reused: the next job gets another.
    assert after["state"] == "SUCCEEDED" and after["output"] == 2, after
    assert after["attempts"][-1]["pods"] != first["attempts"][-1]["pods"], after
    assert after["acquisition"]["path"] != "warm", after


def test_a_slow_install_is_waited_for_not_taken_for_a_lost_pod(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow install (a hanging index) is not a lost pod: the install has its own budget,
    before the job's clock starts, so an attempt is not given up after the job's
    ``timeout_s`` plus its grace and retried on new pods. Here the grace is 1 s and the
    function's timeout 1 s, and the wheel takes 4 s to serve."""
    monkeypatch.setattr(executor_module, "GRACE_S", 1.0)
    wheel = make_wheel(tmp_path / "wheels", "served late")

    class SlowWheel(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(wheel.stat().st_size))
            self.end_headers()

        def do_GET(self) -> None:
            time.sleep(4.0)
            self.do_HEAD()
            self.wfile.write(wheel.read_bytes())

        def log_message(self, *args: Any) -> None:
            pass

    index = http.server.ThreadingHTTPServer(("127.0.0.1", 0), SlowWheel)
    threading.Thread(target=index.serve_forever, daemon=True).start()
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"demo-pkg @ http://127.0.0.1:{index.server_port}/{wheel.name}\n")
    code = tmp_path / "fn"
    code.mkdir()
    (code / "probe.py").write_text(
        "def version(x):\n    import demo_pkg\n    return demo_pkg.VALUE\n"
    )
    try:
        # Unsandboxed: the index listens on the host's loopback, which a sandboxed pod's
        # network namespace does not reach (pod_runtime.network).
        with threaded_broker(tmp_path / "home", sandbox=False) as served:
            with served.client("dev", Role.DEPLOY) as fp:
                fp.deploy(code, name="probe", sku="cpu", entrypoint="probe:version",
                          requirements=requirements, timeout_s=1.0, max_retries=0)  # fmt: skip
            with served.client("user", Role.INVOKE) as fp:
                job = fp.invoke("probe", None, lease_tag="t")
    finally:
        index.shutdown()
        index.server_close()
    assert job["state"] == "SUCCEEDED" and job["output"] == "served late", job["error"]
    assert len(job["attempts"]) == 1


def _running(served: ThreadedBroker, seconds: float, max_retries: int) -> tuple[Client, str, str]:
    """A user's client, the id of a ``behaviours:sleep`` job of ``seconds`` (deployed with
    ``max_retries``) and its pod, once its agent holds it."""
    with served.client("dev", Role.DEPLOY) as fp:
        fp.deploy(BEHAVIOURS, name="sleep", sku="cpu", entrypoint="behaviours:sleep",
                  max_retries=max_retries)  # fmt: skip
    fp = served.client("user", Role.INVOKE)
    job_id = fp.submit("sleep", seconds)
    return fp, job_id, wait_at_agent(served.home, wait_running(fp, job_id))


def test_a_lost_pods_error_names_the_pod_not_the_brokers_files(tmp_path: Path) -> None:
    """A PodLost error carried the agent's endpoint: a socket path inside the broker's state
    directory, which callers have no business knowing."""
    with threaded_broker(tmp_path / "home") as served:
        fp, job_id, pod = _running(served, 30, max_retries=0)
        with fp:
            os.kill(agent_pid(pod), signal.SIGKILL)
            job = fp.wait(job_id, timeout_s=60)
    assert job["error"]["class"] == "PodLost", job
    assert pod in job["error"]["message"] and str(tmp_path) not in job["error"]["message"]


def test_a_failing_job_store_answers_503_in_the_error_form(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that fails (a full disk) is ``Unavailable`` (503, try again) in the API's
    error form, not a bare ``500 Internal Server Error`` in text; anything else unexpected is
    ``InternalError`` (500), in the same form."""

    async def store_fails(*args: Any, **kwargs: Any) -> Any:
        raise OperationalError("INSERT ...", {}, Exception("database or disk is full"))

    async def bug(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    with threaded_broker(tmp_path / "home") as served:
        token = served.token("user", Role.INVOKE)
        headers = {"Authorization": f"Bearer {token}"}
        monkeypatch.setattr(served.broker.jobs, "list_jobs", store_fails)
        full = httpx.get(f"{served.url}/v1/jobs", headers=headers)
        monkeypatch.setattr(served.broker.jobs, "list_jobs", bug)
        broken = httpx.get(f"{served.url}/v1/jobs", headers=headers)
    assert full.status_code == 503 and full.json()["error"]["class"] == "Unavailable", full.text
    assert broken.status_code == 500 and broken.json()["error"]["class"] == "InternalError"


def test_an_attempt_the_agent_ended_on_its_own_is_a_lost_pod_not_a_cancel(
    tmp_path: Path,
) -> None:
    """An attempt its agent stopped on its own (a reset the broker did not send, as after a
    full disk) is the pod failing under the job: PodLost, retried within max_retries, not
    CANCELLED, since nobody cancelled."""
    with threaded_broker(tmp_path / "home") as served:
        fp, job_id, pod = _running(served, 2, max_retries=1)
        with fp:
            agent = UnixHTTPConnection(
                served.broker.pods.endpoints[pod].removeprefix("unix:"), 10.0
            )
            try:
                agent.request("POST", "/reset", body=b"{}", headers=agent_headers(served.home, pod))
                # The broker may delete the pod (lost under its job) before the agent
                # answers this reset: then the connection closes with no answer.
                with contextlib.suppress(http.client.RemoteDisconnected, ConnectionError):
                    assert agent.getresponse().status == 200
            finally:
                agent.close()
            job = fp.wait(job_id, timeout_s=60)
    assert job["state"] == "SUCCEEDED", job
    assert [a["error"]["class"] for a in job["attempts"][:-1]] == ["PodLost"], job["attempts"]
    assert job["retries"] == 1


def test_a_pod_whose_owner_cannot_be_recorded_runs_no_user_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner is recorded on the pods before user code runs there: where it cannot be
    (a full disk), the job does not launch, or a restarted broker could hand one caller's
    pods, unrecorded, to another."""
    with threaded_broker(tmp_path / "home") as served:
        real_annotate = served.broker.backend.annotate

        async def annotate(name: str, notes: Any) -> None:
            if "firepool/owner" in notes:
                raise OSError(28, "No space left on device")
            await real_annotate(name, notes)

        monkeypatch.setattr(served.broker.backend, "annotate", annotate)
        with served.client("dev", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="chatty", sku="cpu", entrypoint="behaviours:chatty",
                      max_retries=1)  # fmt: skip
        with served.client("user", Role.INVOKE) as fp:
            job = fp.invoke("chatty", "never", lease_tag="t")
    assert job["state"] == "FAILED" and job["error"]["class"] == "PodLost", job
    assert "owner could not be recorded" in job["error"]["message"]
    assert len(job["attempts"]) == 2 and job["timings"]["first_instruction"] is None, job


def test_an_idle_pod_that_stops_is_replaced_before_a_job_gets_it(tmp_path: Path) -> None:
    """A floor pod killed while idle is noticed and replaced, not left IDLE for the next
    job to fail ``PodLost`` on (``max_retries: 0``)."""
    catalog = "pools:\n  cpu: {min_count: 1, max_idle_count: 1, max_count: 2}\n"
    server = start_broker(tmp_path / "home", catalog)
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop",
                      max_retries=0)  # fmt: skip
        with server.client("ops", Role.ADMIN) as fp:

            def pods(state: str | None = None) -> list[str]:
                listed = fp._http.get("/v1/pools?pods=1").json()["pod_list"]
                return [p["name"] for p in listed if state in (None, p["state"])]

            deadline = time.monotonic() + 30
            while not (idle := pods("IDLE")):
                assert time.monotonic() < deadline, "no floor pod"
                time.sleep(0.1)
            os.kill(agent_pid(idle[0]), signal.SIGKILL)
            deadline = time.monotonic() + 15
            while idle[0] in pods():
                assert time.monotonic() < deadline, "the dead pod is still tracked"
                time.sleep(0.2)
        with server.client("alice") as fp:
            job = fp.invoke("noop", {})
        assert job["state"] == "SUCCEEDED", job["error"]
        assert job["attempts"][0]["pods"] != idle
        assert "stopped while idle" in server.log()
    finally:
        server.stop()
        kill_pods(tmp_path / "home")


def test_a_claim_undone_by_a_store_outage_is_not_counted_as_an_acquisition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``firepool_acquisitions_total`` counts the claims that launched: one a failed
    RUNNING commit undid is not one, so one attempt reads as one acquisition."""
    with threaded_broker(tmp_path / "home") as served:
        real_update = served.broker.jobs.update
        failed: list[str] = []

        async def flaky_update(job: Any, revision: int) -> Any:
            if job.state.value == "RUNNING" and not failed:
                failed.append(job.id)
                raise OperationalError("UPDATE ...", {}, Exception("database is locked"))
            return await real_update(job, revision)

        monkeypatch.setattr(served.broker.jobs, "update", flaky_update)
        with served.client("dev", Role.DEPLOY) as fp:
            fp.deploy(EXAMPLES / "noop", name="noop", sku="cpu", entrypoint="noop:noop")
            job = fp.invoke("noop", {})
        claims = {k: v for k, v in served.broker.counters.items() if k.startswith("path_")}
    assert job["state"] == "SUCCEEDED" and failed == [job["id"]], (job["state"], failed)
    assert sum(claims.values()) == 1, claims


def test_an_upload_is_streamed_to_disk_not_held_in_memory(tmp_path: Path) -> None:
    """An upload goes to disk as it arrives: the broker never holds a package whole (4
    parallel 400 MiB uploads would take gigabytes of its memory)."""
    import hashlib
    import tracemalloc

    chunk, count = b"x" * (1 << 20), 48
    digest = hashlib.sha256(chunk * count).hexdigest()

    def body() -> Iterator[bytes]:
        for _ in range(count):
            yield chunk

    with threaded_broker(tmp_path / "home") as served:
        token = served.token("dev", Role.DEPLOY)
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "text/plain"}
        tracemalloc.start()
        try:
            resp = httpx.put(f"{served.url}/v1/packages/{digest}", content=body(), headers=headers,
                             timeout=60)  # fmt: skip
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        stored = served.broker.packages.path(digest).stat().st_size
    assert resp.status_code == 201, resp.text
    assert stored == len(chunk) * count
    assert peak < 16 * (1 << 20), f"{peak / (1 << 20):.1f} MiB traced for a 48 MiB upload"
