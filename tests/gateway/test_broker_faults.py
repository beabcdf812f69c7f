"""A fault inside the broker itself must not strand a job on its leased pods.

The subprocess broker of the other tests cannot be made to fail from outside, so this one runs
the real broker in this process (uvicorn on a loopback port in a thread, real local pods, the
real SQLite store) and injects the fault by patching ``Executor.run`` for jobs whose input asks
for it. What is patched is the one call the dispatcher guards; everything around it is real.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from functions.sdk import Client
from gateway.app import create_app
from gateway.auth import Role
from gateway.broker import Broker
from gateway.executor import Executor, Outcome
from gateway.harness import free_port, kill_pods
from gateway.settings import Settings
from tests.conftest import EXAMPLES

FAULT = "raise inside the executor"


@contextlib.contextmanager
def in_process_broker(home: Path, keep_pods: bool = False) -> Iterator[tuple[Broker, str]]:
    """A broker served by uvicorn in a thread; stopped, its pods killed (unless
    ``keep_pods``, for a broker started after it on ``home``), afterwards."""
    catalog = home / "catalog.yaml"
    home.mkdir(parents=True, exist_ok=True)
    catalog.write_text("pools:\n  cpu: {min_count: 0, max_count: 4}\n")
    settings = Settings(home=home, port=free_port(), catalog_path=catalog)
    broker = Broker(settings)
    config = uvicorn.Config(
        create_app(broker), host=settings.host, port=settings.port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="broker", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the broker did not start"
        time.sleep(0.02)
    try:
        yield broker, settings.resolved_public_url
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        if not keep_pods:
            kill_pods(home)


def test_a_broker_error_fails_the_job_as_internal_and_deletes_its_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_run = Executor.run

    async def run_or_fail(self: Executor, job: Any, *args: Any, **kwargs: Any) -> Outcome:
        if job.input == FAULT:
            raise RuntimeError("injected")
        return await real_run(self, job, *args, **kwargs)

    monkeypatch.setattr(Executor, "run", run_or_fail)
    with in_process_broker(tmp_path / "home") as (broker, url):
        token = broker.auth.mint("deployer", Role.DEPLOY, 3600)
        with Client(url, token, timeout=60) as fp:
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
