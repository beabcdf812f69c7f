"""A pod agent answers only its broker: every call but a bare ``GET /healthz`` carries the
pod's own secret (``pod_runtime.agent_auth``), or is refused 401. Held here on local pods on
TCP, which any process that can reach the address could otherwise call; the kubernetes
backend's pods are held to it in ``tests/backends/test_kubernetes_e2e.py``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from broker.agent_client import AgentClient
from pod_runtime.agent_auth import (
    SECRET_ENV,
    agent_key,
    bearer,
    pod_of,
    pod_secret,
    tcp_endpoint,
)
from pod_runtime.settings import parse_args
from pool_manager.backends.base import BackendPod
from pool_manager.backends.local import LocalBackend
from pool_manager.catalog import PoolSpec

KEY = agent_key(b"k" * 32)
ATTEMPT = {"attempt_id": "job1:1", "package": None, "entrypoint": "json:loads",
           "input": "1", "timeout_s": 30, "wait": True}  # fmt: skip


@pytest.fixture
async def tcp_pod(tmp_path: Path) -> AsyncIterator[tuple[BackendPod, str]]:
    """A ready local pod listening on TCP at 127.0.0.1, and its base URL."""
    backend = LocalBackend(tmp_path / "pods", sandbox=False, agent_key=KEY, tcp_host="127.0.0.1")
    pod = await backend.create("cpu-a", PoolSpec(sku="cpu"))
    agents = AgentClient(KEY)
    try:
        for _ in range(1500):
            if await agents.health(pod.endpoint, timeout=1.0) is not None:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the pod never answered")
        yield pod, "http://" + pod.endpoint.removeprefix("tcp:").partition("#")[0]
    finally:
        await agents.close()
        await backend.delete("cpu-a")


async def test_a_call_without_the_pods_secret_is_refused_401(
    tcp_pod: tuple[BackendPod, str],
) -> None:
    _, url = tcp_pod
    async with aiohttp.ClientSession() as http:
        for headers in ({}, bearer("0" * 64), bearer(pod_secret(KEY, "cpu-b"))):
            async with http.post(url + "/attempts", json=ATTEMPT, headers=headers) as resp:
                assert resp.status == 401, headers
            async with http.post(url + "/reset", json={}, headers=headers) as resp:
                assert resp.status == 401
            async with http.get(url + "/attempts/job1:1", headers=headers) as resp:
                assert resp.status == 401
        async with http.get(url + "/healthz") as resp:  # a probe: up, and nothing more
            assert (resp.status, await resp.json()) == (200, {"pod": "cpu-a", "authorized": False})


async def test_the_broker_with_the_key_runs_an_attempt(tcp_pod: tuple[BackendPod, str]) -> None:
    pod, _ = tcp_pod
    agents = AgentClient(KEY)
    try:
        health = await agents.health(pod.endpoint)
        assert health is not None and health["busy"] is False  # the full report
        status, result = await agents.start(pod.endpoint, ATTEMPT, timeout=30)
        assert (status, result["state"], result["output"]) == (200, "succeeded", 1), result
        job = {**ATTEMPT, "attempt_id": "job2:1", "entrypoint": "os:getenv", "input": SECRET_ENV}
        await agents.reset(pod.endpoint)
        status, result = await agents.start(pod.endpoint, job, timeout=30)
        assert (status, result["state"]) == (200, "succeeded"), result
        assert result["output"] is None, "a job must not see its agent's secret"
    finally:
        await agents.close()
    stranger = AgentClient(agent_key(b"another broker's key".ljust(32)))
    try:
        status, body = await stranger.start(pod.endpoint, {**ATTEMPT, "attempt_id": "x:1"}, 30)
        assert status == 401, body
        assert await stranger.health(pod.endpoint) is None  # a pod it cannot use
    finally:
        await stranger.close()


def test_the_secret_stays_out_of_jobs_and_the_command_line(tmp_path: Path) -> None:
    """It reaches the agent through its environment under a ``FIREPOOL_AGENT_`` name, which
    ``pod_runtime.jobenv`` keeps from jobs; a TCP agent without one refuses to start."""
    from pod_runtime.jobenv import AGENT_PRIVATE_PREFIXES

    assert SECRET_ENV.startswith(AGENT_PRIVATE_PREFIXES)
    argv = ["--pod-name", "p", "--pod-dir", str(tmp_path), "--listen", "tcp:127.0.0.1:1"]
    saved = os.environ.pop(SECRET_ENV, None)
    try:
        with pytest.raises(SystemExit):
            parse_args(argv)
        os.environ[SECRET_ENV] = "s3cret"
        assert parse_args(argv).secret == "s3cret"
    finally:
        os.environ.pop(SECRET_ENV, None)
        if saved is not None:
            os.environ[SECRET_ENV] = saved


def test_an_endpoint_names_its_pod() -> None:
    assert pod_of(tcp_endpoint("10.0.0.7", 8090, "cpu-a1")) == "cpu-a1"
    assert pod_of("unix:/state/pods/cpu-a1/agent.sock") == "cpu-a1"
    assert pod_of("tcp:10.0.0.7:8090") is None
    assert pod_secret(KEY, "cpu-a1") != pod_secret(KEY, "cpu-a2")
    assert pod_secret(KEY, "cpu-a1") != pod_secret(agent_key(b"x" * 32), "cpu-a1")
