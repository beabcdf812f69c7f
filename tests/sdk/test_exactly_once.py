"""The SDK's retries are exactly-once in effect (paper A.1): while an ``AsyncClient.map`` of
300 side-effecting calls runs, the broker process is SIGKILLed and restarted on its state
directory several times; every call's Idempotency-Key, resent by the SDK while the broker is
down, finds the job it created, so each input runs exactly once and every output comes back.

Executions are counted outside the pod, by the function's own side effect: an HTTP hit per
run on a recorder in this process (``benchmarks.crash.Recorder``), the crash benchmark's
function (``benchmarks/crash_fn``)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from benchmarks.crash import FN, Recorder
from functions.sdk import AsyncClient
from gateway.auth import Role
from gateway.harness import free_port, kill_pods, start_broker

CATALOG = (
    "budgets: {cpu: 16}\n"
    "pools:\n"
    "  cpu: {min_count: 4, max_idle_count: 8, max_count: 8, idle_timeout_s: 600,"
    " network: host}\n"
)
"""``network: host``: each run reports to the recorder on this host's loopback."""
CALLS = 300
KILL_AT = (40, 120, 200)
"""Outputs yielded before each SIGKILL: three kills spread over the run."""


@pytest.mark.slow
def test_a_map_through_three_broker_kills_runs_every_input_exactly_once(tmp_path: Path) -> None:
    recorder = Recorder()
    home = tmp_path / "home"
    port = free_port()
    server = start_broker(home, CATALOG, port=port)
    token = server.token("trainer")
    done: list[object] = []
    failure: list[BaseException] = []
    try:
        with server.client("deployer", Role.DEPLOY) as fp:
            fp.deploy(FN, name="work", sku="cpu", entrypoint="crashfn:work", max_retries=3)
        inputs = [{"key": f"k{i}", "recorder": recorder.url, "sleep": 0.01} for i in range(CALLS)]

        async def mapping() -> None:
            async with AsyncClient(server.url, token) as client:
                async for output in client.function("work").map(inputs, concurrency=16):
                    done.append(output)

        def run() -> None:
            try:
                asyncio.run(mapping())
            except BaseException as exc:
                failure.append(exc)

        caller = threading.Thread(target=run, daemon=True)  # a failed test does not hang on it
        caller.start()
        for mark in KILL_AT:
            deadline = time.monotonic() + 120
            while len(done) < mark and caller.is_alive():
                assert time.monotonic() < deadline, f"stuck at {len(done)} outputs"
                time.sleep(0.01)
            server.kill()
            time.sleep(0.3)  # calls meet a closed port, then a starting broker
            server = start_broker(home, CATALOG, port=port)
        caller.join(timeout=300)
        assert not caller.is_alive(), f"the map never finished ({len(done)} outputs)"
    finally:
        server.stop()
        kill_pods(home)
        recorder.close()
    assert not failure, failure
    assert done == [{"key": f"k{i}"} for i in range(CALLS)], "every output, in input order"
    runs = recorder.hits
    assert sorted(runs) == sorted(f"k{i}" for i in range(CALLS)), "every input ran"
    assert {key: n for key, n in runs.items() if n != 1} == {}, "and none twice"
