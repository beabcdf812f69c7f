"""What a hostile job does to its pod stays bounded: it cannot stop the clock by stopping the
zygote, cannot make the agent hold (or the broker store) unbounded output, cannot steer the
reset through a symlink or a read-only directory, and cannot make an agent answer unreadable."""

from __future__ import annotations

import fcntl
import os
import struct
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pod_runtime import job_main
from pod_runtime.launch import sandbox_status
from pod_runtime.settings import AgentSettings
from tests.conftest import require_sandbox
from tests.pod_runtime.conftest import AgentProcess, make_zip

HOSTILE = r"""
import os, signal, sys, time

def stop_zygote(x):
    os.kill(os.getppid(), signal.SIGSTOP)
    return {}

def stop_zygote_later(x):
    import subprocess
    subprocess.Popen(["sh", "-c", f"sleep {x}; kill -STOP {os.getppid()}"],
                     start_new_session=True)
    return "returned"

def huge_output(n):
    return "x" * n

def shout(n):
    line = "y" * 1023 + "\n"
    for _ in range(n // 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    return "still running"

def lock_dirs(x):
    for d in (os.getcwd(), os.environ["FIREPOOL_SCRATCH_DIR"]):
        with open(os.path.join(d, "inside.txt"), "w") as f:
            f.write("x")
        os.chmod(d, 0o500)
    return "locked"

def write_scratch(x):
    with open(os.path.join(os.environ["FIREPOOL_SCRATCH_DIR"], "new.txt"), "w") as f:
        f.write("x")
    return os.listdir(os.environ["FIREPOOL_SCRATCH_DIR"])

def forge_result(depth):
    # Write the result file the runtime would, past its checks, and leave without a word.
    import json
    value = []
    for _ in range(depth - 1):
        value = [value]
    attempt_dir = os.path.dirname(os.environ["FIREPOOL_INPUT_FILE"])
    with open(os.path.join(attempt_dir, "result.json"), "w") as f:
        f.write(json.dumps({"ok": True, "output": value} if depth else [1]))
    os._exit(0)

def ok(x):
    return "ok"
"""


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    url, digest = make_zip(tmp_path_factory.mktemp("hostile") / "h.zip", {"hostile.py": HOSTILE})
    return {"url": url, "digest": digest}


def job(attempt_id: str, pkg: dict[str, str], fn: str, input: Any = None, **extra: Any) -> Any:
    return {
        "attempt_id": attempt_id,
        "package": pkg,
        "entrypoint": f"hostile:{fn}",
        "input": input,
        **extra,
    }


def test_a_job_that_stops_its_zygote_still_times_out_and_the_next_job_runs(
    agent_factory: Callable[..., AgentProcess], hostile: dict[str, str]
) -> None:
    agent = agent_factory(name="stopped")
    start = time.monotonic()
    result = agent.run(job("stop-1:1", hostile, "stop_zygote", timeout_s=1.0), timeout=30)
    assert result["state"] == "failed" and result["error"]["class"] == "Timeout", result
    assert time.monotonic() - start < 15
    assert agent.reset()["clean"] is True
    assert agent.run(job("stop-2:1", hostile, "ok"), timeout=60)["output"] == "ok"


def test_a_job_that_stops_its_zygote_can_still_be_cancelled(
    agent_factory: Callable[..., AgentProcess], hostile: dict[str, str]
) -> None:
    agent = agent_factory(name="stopcancel")
    status, _ = agent.call("POST", "/attempts", job("stopc-1:1", hostile, "stop_zygote"))
    assert status == 202
    time.sleep(1.0)  # the job has stopped the zygote and exited by now
    start = time.monotonic()
    status, body = agent.call("DELETE", "/attempts/stopc-1:1", timeout=30)
    assert status == 200 and body["state"] == "cancelled", body
    assert body["error"]["class"] == "Cancelled"
    assert time.monotonic() - start < 10
    assert agent.reset()["clean"] is True
    assert agent.run(job("stopc-2:1", hostile, "ok"), timeout=60)["output"] == "ok"


def test_a_zygote_stopped_after_its_job_returned_is_replaced_for_the_next_job(
    agent_factory: Callable[..., AgentProcess], hostile: dict[str, str]
) -> None:
    agent = agent_factory(name="stoplater")
    result = agent.run(job("later-1:1", hostile, "stop_zygote_later", 0.2))
    assert result["output"] == "returned", result
    time.sleep(1.0)  # its daemon has stopped the zygote
    assert agent.reset()["clean"] is True
    start = time.monotonic()
    assert agent.run(job("later-2:1", hostile, "ok"), timeout=60)["output"] == "ok"
    assert time.monotonic() - start < 5  # no wait for an answer that never comes


def test_a_return_value_over_the_output_cap_is_a_function_error(
    agent: AgentProcess, hostile: dict[str, str]
) -> None:
    cap = job_main.MAX_OUTPUT_BYTES
    result = agent.run(job("big-1:1", hostile, "huge_output", cap + 1))
    assert result["state"] == "failed" and result["error"]["class"] == "FunctionError", result
    assert str(cap + 3) in result["error"]["message"]  # its size as JSON (quotes included)
    assert str(cap) in result["error"]["message"]
    assert result["output"] is None
    fits = agent.run(job("big-2:1", hostile, "huge_output", 1000))
    assert fits["state"] == "succeeded" and fits["output"] == "x" * 1000


def test_the_output_cap_is_the_brokers_largest_json_body() -> None:
    from broker.settings import Settings

    broker_cap = Settings.__dataclass_fields__["max_json_bytes"].default
    assert broker_cap == job_main.MAX_OUTPUT_BYTES


def test_an_attempt_log_is_capped_at_the_agent_and_the_job_keeps_running(
    agent_factory: Callable[..., AgentProcess], hostile: dict[str, str]
) -> None:
    assert AgentSettings("p", Path("/p"), "unix:/s").max_log_bytes == 64 * 1024 * 1024
    cap = 100_000
    agent = agent_factory("--max-log-bytes", str(cap), name="loud")
    result = agent.run(job("loud-1:1", hostile, "shout", 2_000_000))
    assert result["state"] == "succeeded" and result["output"] == "still running", result
    log = (agent.pod_dir / "attempts" / "loud-1:1" / "log").read_bytes()
    assert cap - 2048 < len(log) < cap + 200  # its head and tail, cut at line ends
    lines = log.splitlines(keepends=True)
    assert set(lines) == {b"y" * 1023 + b"\n", lines[48]}, "whole lines and one marker line"
    kept = len(log) - len(lines[48])
    dropped = 2_000_000 // 1024 * 1024 - kept
    marker = f"[firepool] {dropped} bytes of this log dropped here: a log over {cap} bytes "
    assert lines[48] == (marker + "keeps its start and its end\n").encode()
    data, offset = "", 0
    while True:
        status, chunk = agent.call("GET", f"/attempts/loud-1:1/logs?offset={offset}")
        assert status == 200
        data, offset = data + chunk["data"], chunk["offset"]
        if chunk["done"]:
            break
    assert data.encode() == log


@pytest.mark.parametrize("depth", [0, job_main.MAX_NESTING + 1, 600])
def test_a_result_file_the_job_forged_is_checked_like_a_return_value(
    agent: AgentProcess, hostile: dict[str, str], depth: int
) -> None:
    """Too deep for the hops after the agent (at 600 levels its own answer could not be
    encoded), or not an object at all (depth 0): a FunctionError, and the pod stays usable."""
    result = agent.run(job(f"forge-{depth}:1", hostile, "forge_result", depth))
    assert result["state"] == "failed", result
    assert result["error"]["class"] == "FunctionError", result
    assert agent.reset()["clean"] is True
    assert agent.run(job(f"forge-{depth}:2", hostile, "ok"))["output"] == "ok"


@pytest.mark.parametrize("linked", ["workspace/scratch", "workspace/pkg", "workspace"])
def test_reset_removes_a_symlinked_wipe_dir_and_never_empties_its_target(
    agent: AgentProcess, tmp_path: Path, linked: str
) -> None:
    victim = tmp_path / "victim"
    for sub in ("", "pkg", "scratch", "gpu"):
        (victim / sub).mkdir(exist_ok=True)
        (victim / sub / "keep.txt").write_text("not the pod's")
    link = agent.pod_dir / linked
    (agent.pod_dir / "workspace.old").mkdir(exist_ok=True)
    link.rename(agent.pod_dir / "workspace.old" / link.name)
    link.symlink_to(victim)
    try:
        report = agent.reset()
        assert report["clean"] is True, report
        for sub in ("", "pkg", "scratch", "gpu"):
            assert (victim / sub / "keep.txt").read_text() == "not the pod's"
        for wiped in ("pkg", "scratch", "gpu"):
            path = agent.pod_dir / "workspace" / wiped
            assert path.is_dir() and not path.is_symlink() and list(path.iterdir()) == []
        assert not (agent.pod_dir / "workspace").is_symlink()
    finally:  # put the pod back as it was if the reset did not
        if link.is_symlink():
            link.unlink()
            (agent.pod_dir / "workspace.old" / link.name).rename(link)


@pytest.fixture(scope="module")
def capless_agent(agent_factory: Callable[..., AgentProcess]) -> AgentProcess:
    """An agent whose file permissions bind it: sandboxed (every capability dropped), or a
    plain one when this test does not run as root."""
    if sandbox_status()[0]:
        return agent_factory(name="capless", sandbox=True)
    if os.geteuid() == 0:  # permissions never bind root: only the sandbox's dropped capabilities
        require_sandbox()
    return agent_factory(name="capless")


def test_reset_makes_read_only_top_level_wipe_dirs_writable_again(
    capless_agent: AgentProcess,
) -> None:
    agent = capless_agent
    url, digest = make_zip(agent.pod_dir / "h.zip", {"hostile.py": HOSTILE})  # not in /tmp
    pkg = {"url": url, "digest": digest}
    locked = agent.run(job("ro-1:1", pkg, "lock_dirs"))
    assert locked["output"] == "locked", locked
    report = agent.reset()
    assert report["clean"] is True, report
    result = agent.run(job("ro-2:1", pkg, "write_scratch"))
    assert result["state"] == "succeeded" and result["output"] == ["new.txt"], result


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _set_immutable(path: Path, on: bool) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 4))[0]
        flags = flags | FS_IMMUTABLE_FL if on else flags & ~FS_IMMUTABLE_FL
        fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags))
    finally:
        os.close(fd)


@pytest.fixture
def stuck_file(agent: AgentProcess) -> Iterator[Path]:
    """A file in scratch named with bytes that are not UTF-8, which nobody may unlink."""
    path = Path(os.fsdecode(bytes(agent.pod_dir / "workspace" / "scratch") + b"/stuck-\xff.txt"))
    path.write_text("x")
    try:
        _set_immutable(path, True)
    except OSError as exc:
        path.unlink()
        pytest.skip(f"cannot make a file immutable here: {exc}")
    yield path
    _set_immutable(path, False)
    path.unlink()


def test_an_unclean_reset_naming_a_non_utf8_file_still_answers_json(
    agent: AgentProcess, stuck_file: Path
) -> None:
    status, report = agent.call("POST", "/reset", {})
    assert status == 200, report
    assert report["clean"] is False
    assert "stuck-\\xff.txt" in report["reason"], report
