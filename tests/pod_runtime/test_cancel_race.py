"""A cancel that lands in the same event-loop iteration as an attempt's start (the broker's
DELETE and POST arrive together) must still settle the attempt and free the pod.

The agent runs in its own interpreter (it makes itself a child subreaper, a process-wide
setting), driven in-process there so that the cancel deterministically precedes the attempt
task's first step, which no HTTP client can arrange."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = """
import asyncio, json, sys
from pathlib import Path
from functions.errors import ErrorClass
from pod_runtime.agent import Agent
from pod_runtime.protocol import AttemptSpec
from pod_runtime.settings import AgentSettings

async def main(pod_dir):
    agent = Agent(AgentSettings(pod_name="race", pod_dir=pod_dir, listen="unix:unused",
                                zygote=False, cgroups=False))
    await agent.start()
    try:
        def spec(n, code):
            return AttemptSpec(attempt_id=f"race-{n}:1", package=None, entrypoint=None,
                               command=(sys.executable, "-c", code), input=None)
        first = await agent.start_attempt(spec(1, "import time; time.sleep(30)"))
        await agent.runner.kill(first, ErrorClass.CANCELLED)  # before the task's first step
        await asyncio.wait_for(first.done.wait(), 10)
        settled = {"result": first.result.to_json(), "busy": agent.current is not None}
        second = await agent.start_attempt(spec(2, "pass"))
        await asyncio.wait_for(second.done.wait(), 30)
        settled["next"] = second.result.state
        print(json.dumps(settled))
    finally:
        await agent.stop()

asyncio.run(main(Path(sys.argv[1])))
"""


def test_a_cancel_before_the_attempt_task_runs_settles_it_and_frees_the_pod(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "pod")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    settled = json.loads(done.stdout)
    assert settled["result"]["state"] == "cancelled"
    assert settled["result"]["error"]["class"] == "Cancelled"
    assert settled["busy"] is False and settled["next"] == "succeeded"
