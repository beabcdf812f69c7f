"""`firepool serve` stopped with Ctrl-C (SIGINT) exits 130 after a clean stop, with no
traceback in its log, and answers the sync invokes still waiting before it stops."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx

from gateway.auth import Role
from gateway.harness import kill_pods, start_broker


def test_serve_stopped_by_sigint_exits_130_without_a_traceback(tmp_path: Path) -> None:
    home = tmp_path / "home"
    server = start_broker(home, extra_env={"FIREPOOL_ALLOW_UNSANDBOXED": "1"})
    try:
        server.stop()
        assert server.proc.returncode == 130
        log = server.log()
        assert "Traceback" not in log, log[-3000:]
        assert "KeyboardInterrupt" not in log, log[-3000:]
    finally:
        server.stop()
        kill_pods(home)


BEHAVIOURS = Path(__file__).resolve().parent / "behaviours"


def test_a_sync_invoke_waiting_at_shutdown_is_answered_202_with_its_job(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {"FIREPOOL_ALLOW_UNSANDBOXED": "1", "FIREPOOL_DRAIN_S": "1"}
    server = start_broker(home, extra_env=env)
    answers: list[httpx.Response] = []
    try:
        with server.client("dev", Role.DEPLOY) as fp:
            fp.deploy(BEHAVIOURS, name="sleep", sku="cpu", entrypoint="behaviours:sleep")
        headers = {"Authorization": f"Bearer {server.token('waiter')}"}

        def invoke() -> None:
            url = f"{server.url}/v1/functions/sleep:invoke"
            answers.append(httpx.post(url, json={"input": 30}, headers=headers, timeout=60))

        caller = threading.Thread(target=invoke)
        caller.start()
        with server.client("waiter") as fp:
            deadline = time.monotonic() + 30
            while not fp.jobs(state="RUNNING") and time.monotonic() < deadline:
                time.sleep(0.05)
        server.stop()
        caller.join(timeout=30)
        assert len(answers) == 1
        assert answers[0].status_code == 202, answers[0].text
        assert answers[0].json()["state"] == "RUNNING"
        assert "Traceback" not in server.log(), server.log()[-3000:]
    finally:
        server.stop()  # a no-op once stopped; a failed test leaves no broker serving
        kill_pods(home)
