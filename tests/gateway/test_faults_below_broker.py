"""Faults below the broker: its job store gone for a while, a full disk under its files, a pod
agent that hangs mid-job, a pod it cannot reach when it recovers. Each on a real broker (a
process, or uvicorn in this process where a part must be patched), real pods, a real store.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from broker.executor import GRACE_S
from broker.recovery import PROBE_TRIES
from functions.sdk import ApiError
from gateway.auth import Role
from gateway.errors import RETRY_AFTER_S
from gateway.harness import kill_pods, start_broker
from tests.conftest import BEHAVIOURS, agent_pid, wait_running
from tests.helpers import agent_health, wait_at_agent
from tests.tcp_proxy import tcp_proxy

CATALOG = "budgets: {cpu: 8}\npools:\n  cpu: {min_count: 2, max_idle_count: 2, max_count: 4}\n"
OUTAGE_S = 10.0


@pytest.mark.mysql
def test_a_store_outage_refuses_submits_with_retry_after_and_loses_no_outcome(
    mysql_url: str, tmp_path: Path
) -> None:
    """The broker's MySQL connection is cut for ``OUTAGE_S`` (a proxy between them closes every
    connection and refuses new ones; the server itself stays up): submits answer 503
    ``Unavailable`` with ``Retry-After``; the jobs running through it finish in their pods,
    and their outcomes are committed once the store is back, each job run once; the broker
    takes submits again afterwards."""
    server_url = make_url(mysql_url)
    with tcp_proxy(server_url.host or "127.0.0.1", server_url.port or 3306) as proxy:
        store = server_url.set(port=proxy.port).render_as_string(hide_password=False)
        home = tmp_path / "home"
        server = start_broker(home, CATALOG, extra_env={"FIREPOOL_STORE_URL": store})
        try:
            with server.client("dev", Role.DEPLOY) as fp:
                fp.deploy(BEHAVIOURS, name="sleepy", sku="cpu", entrypoint="behaviours:sleep")
            with server.client("user") as fp:
                running = [fp.submit("sleepy", 3) for _ in range(2)]
                for job_id in running:
                    wait_running(fp, job_id)
                proxy.cut()
                cut_at = time.monotonic()
                answers: list[tuple[int, str | None]] = []
                headers = {"Authorization": f"Bearer {server.token('user')}"}
                with httpx.Client(base_url=server.url, headers=headers, timeout=30) as http:
                    while time.monotonic() - cut_at < OUTAGE_S:
                        resp = http.post("/v1/functions/sleepy/jobs", json={"input": 0})
                        answers.append((resp.status_code, resp.headers.get("retry-after")))
                        if resp.status_code == 503:
                            assert resp.json()["error"]["class"] == "Unavailable", resp.text
                        time.sleep(0.5)
                proxy.restore()
                ended = [fp.wait(job_id, timeout_s=60) for job_id in running]
                after = fp.wait(fp.submit("sleepy", 0), timeout_s=60)
        finally:
            server.stop()
            kill_pods(home)
    refused = [a for a in answers if a[0] == 503]
    assert refused and all(a == (503, str(RETRY_AFTER_S)) for a in refused), answers
    assert all(code == 503 for code, _ in answers[1:]), answers  # one may have slipped in first
    for job in ended:
        assert (job["state"], job["output"], job["retries"]) == ("SUCCEEDED", "slept", 0), job
    assert after["state"] == "SUCCEEDED", after
    engine = create_engine(mysql_url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT id, state FROM jobs WHERE id IN :ids").bindparams(ids=tuple(running))
            ).all()
    finally:
        engine.dispose()
    assert sorted(state for _, state in rows) == ["SUCCEEDED", "SUCCEEDED"], rows


@contextlib.contextmanager
def small_filesystem(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (a disk that fills up), unmounted afterwards.
    Mounting needs root (CAP_SYS_ADMIN): the test is skipped, saying so, without it."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here: {mounted.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_full_package_store_refuses_the_upload_and_the_broker_serves_on(
    tmp_path: Path,
) -> None:
    """Packages on a 512 KiB filesystem: an upload that does not fit is refused with 503
    ``Unavailable`` (with ``Retry-After``), its partial file removed; one that fits is stored
    afterwards, and the broker answers everything else meanwhile."""
    home = tmp_path / "home"
    with small_filesystem(home / "packages", "512k") as packages:
        server = start_broker(home, CATALOG)
        try:
            with server.client("dev", Role.DEPLOY) as fp:
                fp.deploy(BEHAVIOURS, name="sleepy", sku="cpu", entrypoint="behaviours:sleep")
                big = os.urandom(1024 * 1024)
                with pytest.raises(ApiError) as full:
                    fp.upload(big, content_type="application/octet-stream")
                small = fp.upload(os.urandom(1024), content_type="application/octet-stream")
            with server.client("user") as fp:
                job = fp.invoke("sleepy", 0)
            staged = list((packages / ".uploads").iterdir())
            assert httpx.get(f"{server.url}/healthz").status_code == 200
        finally:
            server.stop()
            kill_pods(home)
    assert (full.value.status, full.value.error_class) == (503, "Unavailable"), full.value
    assert "out of space" in str(full.value), full.value
    assert job["state"] == "SUCCEEDED" and len(small) == 64 and staged == []


def test_a_full_log_archive_keeps_what_fits_and_the_pod_serves_the_next_job(
    tmp_path: Path,
) -> None:
    """Logs on a 64 KiB filesystem, one pod: a job that prints 256 KiB succeeds, its log is
    kept as far as it fits, and its attempt is acknowledged (the agent forgets its result) and
    its pod released as usual, so the next job runs on it."""
    home = tmp_path / "home"
    one_pod = "pools:\n  cpu: {min_count: 1, max_idle_count: 1, max_count: 1}\n"
    with small_filesystem(home / "logs", "64k"):
        server = start_broker(home, one_pod)
        try:
            with server.client("dev", Role.DEPLOY) as fp:
                fp.deploy(BEHAVIOURS, name="shout", sku="cpu", entrypoint="behaviours:shout")
            with server.client("user") as fp:
                loud = fp.invoke("shout", 256 * 1024)
                kept = fp.logs(loud["id"]).content
                quiet = fp.invoke("shout", 10, timeout_s=30)
                fp.logs(quiet["id"])  # its archiving (and acknowledgement) has ended
            pod = loud["attempts"][0]["pods"][0]
            held = agent_health(home, pod)["attempts"]
        finally:
            server.stop()
            kill_pods(home)
    assert loud["state"] == "SUCCEEDED" and quiet["state"] == "SUCCEEDED", (loud, quiet)
    assert 0 < len(kept) <= 64 * 1024 and kept.startswith(b"line 00000000 "), len(kept)
    assert quiet["attempts"][0]["pods"] == [pod]
    assert loud["attempts"][0]["id"] not in held, "the agent was never told to forget it"


def test_a_hung_agent_still_ends_its_job_at_the_deadline_and_its_pod_is_retired(
    tmp_path: Path,
) -> None:
    """The pod's agent stops (SIGSTOP) while its job runs: the attempt still ends at its
    deadline (``timeout_s`` and the grace), not when the agent wakes (never, here), as
    ``PodLost``; the pod is deleted, never handed to another job; the retry runs on a new pod
    and ends as ``Timeout``."""
    home = tmp_path / "home"
    server = start_broker(home, CATALOG)
    agent = 0
    try:
        with server.client("dev", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="sleepy", sku="cpu", entrypoint="behaviours:sleep")
        with server.client("user") as fp:
            job_id = fp.submit("sleepy", 600, timeout_s=4)
            pod = wait_at_agent(home, wait_running(fp, job_id))
            agent = agent_pid(pod)
            os.kill(agent, signal.SIGSTOP)
            started = time.monotonic()
            job = fp.wait(job_id, timeout_s=90)
            took = time.monotonic() - started
            record = home / "pods" / f"{pod}.json"
            deadline = time.monotonic() + 30
            while record.exists():
                assert time.monotonic() < deadline, f"{pod} was not retired"
                time.sleep(0.1)
            after = fp.invoke("sleepy", 0)
    finally:
        if agent:
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent, signal.SIGCONT)
        server.stop()
        kill_pods(home)
    hung = job["attempts"][0]
    assert hung["pods"] == [pod] and hung["error"]["class"] == "PodLost", job
    # The attempt's deadline: its timeout_s and the grace its agent has to answer (the
    # broker's own clock; the margin is for a loaded machine, far below "never").
    assert hung["finished"] - hung["started"] < 4 + GRACE_S + 15, hung
    assert took < 4 + GRACE_S + 60, took
    assert job["state"] == "FAILED" and job["error"]["class"] == "Timeout", job
    assert all(pod not in a["pods"] for a in job["attempts"][1:] + after["attempts"])
    assert after["state"] == "SUCCEEDED", after


def _wake_once_unanswered(home: Path, pod: str, agent: int) -> None:
    """Resume ``agent`` once the broker's log says recovery found ``pod`` silent (or after
    60 s: a broker that never asks again never says so)."""
    unanswered = f"pod {pod} did not answer (try 1 of {PROBE_TRIES})"
    deadline = time.monotonic() + 60
    log = home / "broker.log"
    while unanswered not in log.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(agent, signal.SIGCONT)


def test_a_pod_silent_for_a_moment_at_recovery_keeps_its_job(tmp_path: Path) -> None:
    """The broker is killed while a job runs, and the job's agent is stopped (SIGSTOP) across
    the restart until the new broker's recovery has found it silent once: recovery asks it
    again (``PROBE_TRIES``, backing off) rather than deleting the pod after one unanswered
    probe, so the job is re-attached and runs once."""
    home = tmp_path / "home"
    server = start_broker(home, CATALOG)
    agent = 0
    try:
        with server.client("dev", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="sleepy", sku="cpu", entrypoint="behaviours:sleep")
        with server.client("user") as fp:
            job_id = fp.submit("sleepy", 8)
            pod = wait_at_agent(home, wait_running(fp, job_id))
        agent = agent_pid(pod)
        port = int(server.url.rsplit(":", 1)[1])
        server.kill()
        os.kill(agent, signal.SIGSTOP)
        wake = threading.Thread(target=_wake_once_unanswered, args=(home, pod, agent))
        wake.start()
        server = start_broker(home, CATALOG, port=port)
        with server.client("user") as fp:
            job = fp.wait(job_id, timeout_s=90)
        wake.join()
        log = server.log()
    finally:
        if agent:
            with contextlib.suppress(ProcessLookupError):
                os.kill(agent, signal.SIGCONT)
        server.stop()
        kill_pods(home)
    assert (job["state"], job["output"], job["retries"]) == ("SUCCEEDED", "slept", 0), job
    assert [a["pods"] for a in job["attempts"]] == [[pod]], job["attempts"]
    assert f"pod {pod} did not answer (try 1 of {PROBE_TRIES})" in log, log[-3000:]
