"""Faults below the broker: its job store gone for a while, a full disk under its files, a pod
agent that hangs mid-job, a pod it cannot reach when it recovers. Each on a real broker (a
process, or uvicorn in this process where a part must be patched), real pods, a real store.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from functions.sdk import ApiError
from gateway.auth import Role
from gateway.errors import RETRY_AFTER_S
from gateway.harness import kill_pods, start_broker
from tests.conftest import BEHAVIOURS, wait_running
from tests.helpers import agent_health
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
