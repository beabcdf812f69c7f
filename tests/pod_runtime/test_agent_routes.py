"""The agent protocol of docs/architecture.md §1, against a real agent on a unix socket."""

from __future__ import annotations

import base64
import http.server
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.pod_runtime.conftest import AgentProcess, make_zip, proc_alive


def spec(
    attempt_id: str,
    package: dict[str, str] | None,
    entrypoint: str,
    input: Any = None,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "attempt_id": attempt_id,
        "package": package,
        "entrypoint": entrypoint,
        "input": input,
        **extra,
    }


def test_healthz_names_the_pod_and_its_kept_attempts(agent: AgentProcess) -> None:
    status, body = agent.call("GET", "/healthz")
    assert status == 200
    assert body["pod"] == agent.name
    assert body["role"] == "active"
    assert body["busy"] is False
    assert isinstance(body["attempts"], list)


def test_sync_attempt_returns_the_output_with_timings(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    result = agent.run(spec("sync-1:1", package, "jobs:echo", {"a": 1}))
    assert result["state"] == "succeeded", result
    assert result["output"]["input"] == {"a": 1}
    assert result["output"]["cwd"] == str(agent.pod_dir / "workspace" / "pkg")
    assert result["error"] is None and result["exit_code"] == 0
    assert result["started"] <= result["first_instruction"] <= result["finished"]
    assert agent.run(spec("sync-2:1", package, "jobs:double", 21))["output"] == 42


def test_async_attempt_answers_202_then_long_polls(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    status, body = agent.call("POST", "/attempts", spec("async-1:1", package, "jobs:sleep", 0.3))
    assert status == 202 and body == {"attempt_id": "async-1:1"}
    status, body = agent.call("GET", "/attempts/async-1:1")
    assert status == 200 and body["state"] == "running"
    status, body = agent.call("GET", "/attempts/async-1:1?wait=10")
    assert body["state"] == "succeeded" and body["output"] == "woke"
    assert agent.call("GET", "/attempts/nope:1")[0] == 404


def test_a_busy_pod_answers_409_and_cancel_kills_the_job(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    assert agent.call("POST", "/attempts", spec("busy-1:1", package, "jobs:sleep", 30))[0] == 202
    status, body = agent.call("POST", "/attempts", spec("busy-2:1", package, "jobs:echo", 1))
    assert status == 409 and body["error"]["class"] == "Conflict"
    assert agent.call("GET", "/healthz")[1]["busy"] is True
    start = time.monotonic()
    status, body = agent.call("DELETE", "/attempts/busy-1:1")
    assert time.monotonic() - start < 5
    assert body["state"] == "cancelled" and body["error"]["class"] == "Cancelled"
    assert agent.run(spec("busy-2:1", package, "jobs:echo", 1))["state"] == "succeeded"


def test_user_failures_have_their_error_classes(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    boom = agent.run(spec("fail-1:1", package, "jobs:boom", 7))
    assert boom["state"] == "failed" and boom["error"]["class"] == "FunctionError"
    assert "ValueError: bad input 7" in boom["error"]["message"]
    assert "raise ValueError" in boom["error"]["traceback"]
    # A huge message is cut in the result (the log has it whole): a job's error is read
    # with every read and listing of the job.
    long = agent.run(spec("fail-5:1", package, "jobs:boom", "x" * 3_000_000))["error"]
    assert long["message"].startswith("ValueError: bad input xxx") and len(long["message"]) < 8100
    assert long["message"].endswith(" more characters in the log]")
    # An exception whose message cannot be printed still fails as FunctionError.
    unprintable = agent.run(spec("fail-6:1", package, "jobs:bad_str"))["error"]
    assert unprintable["class"] == "FunctionError", unprintable
    assert "Unprintable whose message could not be printed" in unprintable["message"]
    bad = agent.run(spec("fail-2:1", package, "jobs:unserializable"))
    assert bad["error"]["class"] == "FunctionError" and "JSON" in bad["error"]["message"]
    # NaN and Infinity were written as null: SUCCEEDED with {"loss": None} (adversarial run).
    for n, (value, env) in enumerate(
        [("nan", {}), ("-inf", {}), ("nan", {"USE_NUMPY": "1"}), ("1.5", {"USE_NUMPY": "1"})]
    ):
        result = agent.run({**spec(f"fin-{n}:1", package, "jobs:not_finite", value), "env": env})
        if value == "1.5":
            assert result["output"] == {"loss": [1.0, 1.5]}, result
        else:
            assert result["error"]["class"] == "FunctionError", result
            assert "NaN or Infinity" in result["error"]["message"], result
    # job_main failing itself (the result not written) is not the function's NonZeroExit.
    runtime = agent.run(spec("fail-7:1", package, "jobs:result_dir"))["error"]
    assert runtime["class"] == "InternalError" and "runtime failed" in runtime["message"]
    code = agent.run(spec("fail-3:1", package, "jobs:exit_code", 3))
    assert code["error"]["class"] == "NonZeroExit" and code["exit_code"] == 3
    missing = agent.run(spec("fail-4:1", package, "nosuchmodule:fn"))
    assert missing["error"]["class"] == "FunctionError" and missing["exit_code"] == 1


def test_timeout_kills_the_tree(agent: AgentProcess, package: dict[str, str]) -> None:
    result = agent.run(spec("slow-1:1", package, "jobs:sleep", 60, timeout_s=0.5))
    assert result["state"] == "failed" and result["error"]["class"] == "Timeout"
    assert result["finished"] - result["started"] < 5
    pid_file = agent.pod_dir / "workspace" / "scratch" / "daemon.pid"
    result = agent.run(
        spec("slow-2:1", package, "jobs:daemon_then_sleep", str(pid_file), timeout_s=1.0)
    )
    assert result["error"]["class"] == "Timeout"
    assert not proc_alive(int(pid_file.read_text()))  # its setsid daemon died with it


def test_command_mode_reads_input_and_output_files(agent: AgentProcess, tmp_path: Path) -> None:
    script = (
        "import json, os\n"
        "x = json.load(open(os.environ['FIREPOOL_INPUT_FILE']))\n"
        "json.dump({'got': x}, open(os.environ['FIREPOOL_OUTPUT_FILE'], 'w'))\n"
    )
    url, digest = make_zip(tmp_path / "cmd.zip", {"run.py": script})
    pkg = {"url": url, "digest": digest}
    body = {
        "attempt_id": "cmd-1:1",
        "package": pkg,
        "command": ["python3", "run.py"],
        "input": [1, 2],
    }
    result = agent.run(body)
    assert result["state"] == "succeeded" and result["output"] == {"got": [1, 2]}
    failing = agent.run({**body, "attempt_id": "cmd-2:1", "command": ["sh", "-c", "exit 4"]})
    assert failing["error"]["class"] == "NonZeroExit" and failing["exit_code"] == 4
    assert failing["error"]["message"] == "the process exited with code 4"
    # A command that cannot start says why (it was only "exited with code 127": adversarial
    # run, a script without its execute bit and an argument list over the kernel's limit).
    for n, (command, why) in enumerate([
        (["./run.py"], "cannot run './run.py': Permission denied"),
        (["python3", "x" * 200_000], "cannot run 'python3': Argument list too long"),
    ]):  # fmt: skip
        broken = agent.run({**body, "attempt_id": f"cmd-{3 + n}:1", "command": command})
        assert broken["error"]["class"] == "NonZeroExit" and broken["exit_code"] == 127
        assert broken["error"]["message"] == f"the process exited with code 127: {why}"


def test_a_wrong_digest_is_rejected_before_anything_runs(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    wrong = {"url": package["url"], "digest": "0" * 64}
    result = agent.run(spec("digest-1:1", wrong, "jobs:echo"))
    assert result["error"]["class"] == "PackageRejected"
    assert "digest mismatch" in result["error"]["message"]
    assert result["exit_code"] is None and result["first_instruction"] is None


def test_logs_stream_by_offset(agent: AgentProcess, package: dict[str, str]) -> None:
    agent.run(spec("logs-1:1", package, "jobs:chatty", 50))
    data, offset = "", 0
    while True:
        status, chunk = agent.call("GET", f"/attempts/logs-1:1/logs?offset={offset}")
        assert status == 200
        data += chunk["data"]
        offset = chunk["offset"]
        if chunk["done"]:
            break
    assert data.splitlines() == [f"line {i}" for i in range(50)]
    tail = agent.call("GET", f"/attempts/logs-1:1/logs?offset={offset - 8}")[1]
    assert tail["data"] == "line 49\n"


def test_logs_in_base64_are_the_bytes_the_job_wrote(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    written = b"\xff\xfe not utf-8, then a euro sign: \xe2\x82\xac\n"
    printf = r"printf '\377\376 not utf-8, then a euro sign: \342\202\254\n'"
    body = {**spec("bytes-1:1", package, None), "entrypoint": None, "command": ["sh", "-c", printf]}
    assert agent.run(body)["state"] == "succeeded"
    for offset in (0, 2, len(written) - 3, len(written) - 2):  # the last two cut the euro sign
        status, chunk = agent.call(
            "GET", f"/attempts/bytes-1:1/logs?offset={offset}&encoding=base64"
        )
        assert status == 200 and chunk["done"] and chunk["offset"] == len(written)
        assert base64.b64decode(chunk["data"]) == written[offset:]
    # The text form replaces what it cannot decode.
    text = agent.call("GET", "/attempts/bytes-1:1/logs?offset=0")[1]["data"]
    assert text == written.decode("utf-8", "replace")
    status, err = agent.call("GET", "/attempts/bytes-1:1/logs?offset=0&encoding=latin-1")
    assert status == 400 and err["error"]["field"] == "encoding"


def test_an_ended_attempts_small_log_rides_in_its_answer(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    """The answer's ``log`` is exactly what ``GET .../logs`` serves from offset 0; a log
    over ``INLINE_LOG_BYTES`` is left to those reads, and a running attempt has none."""
    answer = agent.run(spec("inline-1:1", package, "jobs:chatty", 50))
    served = agent.call("GET", "/attempts/inline-1:1/logs?offset=0&encoding=base64")[1]
    assert served["done"] and base64.b64decode(answer["log"]) == base64.b64decode(served["data"])
    assert base64.b64decode(answer["log"]).decode().splitlines()[-1] == "line 49"
    polled = agent.call("GET", "/attempts/inline-1:1?wait=5")[1]
    assert polled["log"] == answer["log"]
    big = agent.run(spec("inline-2:1", package, "jobs:chatty", 10_000))  # ~89 KB of lines
    assert big["state"] == "succeeded" and "log" not in big
    agent.call("POST", "/attempts", spec("inline-3:1", package, "jobs:sleep", 0.3))
    running = agent.call("GET", "/attempts/inline-3:1")[1]
    assert running["state"] == "running" and "log" not in running
    assert "log" in agent.call("GET", "/attempts/inline-3:1?wait=10")[1]


def test_results_are_kept_until_acknowledged(agent: AgentProcess, package: dict[str, str]) -> None:
    agent.run(spec("ack-1:1", package, "jobs:double", 1))
    assert "ack-1:1" in agent.call("GET", "/healthz")[1]["attempts"]
    assert agent.call("GET", "/attempts/ack-1:1")[1]["output"] == 2
    status, _ = agent.call("DELETE", "/attempts/ack-1:1/result")
    assert status == 200
    assert agent.call("GET", "/attempts/ack-1:1")[0] == 404
    assert "ack-1:1" not in agent.call("GET", "/healthz")[1]["attempts"]


def test_reposting_a_known_attempt_does_not_run_it_twice(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    first = agent.run(spec("dup-1:1", package, "jobs:echo", 1))
    again = agent.run(spec("dup-1:1", package, "jobs:echo", 1))
    assert again == first


def test_unknown_fields_are_rejected_by_name(agent: AgentProcess) -> None:
    status, body = agent.call(
        "POST", "/attempts", {"attempt_id": "x:1", "entrypoint": "a:b", "bogus": 1}
    )
    assert status == 400 and body["error"]["field"] == "bogus"
    status, body = agent.call("POST", "/attempts", {"attempt_id": "x:1"})
    assert status == 400


def test_reset_kills_leftover_daemons_and_wipes_the_package(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    daemon_pid = agent.run(spec("reset-1:1", package, "jobs:daemon"))["output"]
    assert proc_alive(daemon_pid)
    scratch = agent.pod_dir / "workspace" / "scratch"
    (scratch / "left.txt").write_text("x")
    report = agent.reset()
    assert report["clean"] is True, report
    assert report["duration_ms"] >= 0
    assert not proc_alive(daemon_pid)
    assert list((agent.pod_dir / "workspace" / "pkg").iterdir()) == []
    assert list(scratch.iterdir()) == []


def test_a_cached_package_is_not_fetched_again(agent: AgentProcess, tmp_path: Path) -> None:
    path = tmp_path / "once.zip"
    url, digest = make_zip(path, {"once.py": "def f(x):\n    return 'once'\n"})
    pkg = {"url": url, "digest": digest}
    assert agent.run(spec("cache-1:1", pkg, "once:f"))["output"] == "once"
    path.unlink()
    assert agent.run(spec("cache-2:1", pkg, "once:f"))["output"] == "once"


def test_packages_are_fetched_over_http(agent: AgentProcess, tmp_path: Path) -> None:
    _, digest = make_zip(tmp_path / "web.zip", {"web.py": "def f(x):\n    return 'web'\n"})

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        pkg = {"url": f"http://127.0.0.1:{port}/web.zip?sig=abc", "digest": digest}
        assert agent.run(spec("http-1:1", pkg, "web:f"))["output"] == "web"
        missing = {"url": f"http://127.0.0.1:{port}/nope.zip", "digest": digest[::-1]}
        result = agent.run(spec("http-2:1", missing, "web:f"))
        assert result["error"]["class"] == "PackageFetchFailed"  # a 404: refused at once
        assert "HTTP 404" in result["error"]["message"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_exec_mode_runs_a_fresh_interpreter(
    agent_factory: Callable[..., AgentProcess], package: dict[str, str]
) -> None:
    plain = agent_factory("--no-zygote", name="exec")
    assert plain.call("GET", "/healthz")[1]["zygote"] is False
    result = plain.run(spec("exec-1:1", package, "jobs:echo", 5))
    assert result["state"] == "succeeded" and result["output"]["input"] == 5
    assert plain.run(spec("exec-2:1", package, "jobs:boom", 1))["error"]["class"] == (
        "FunctionError"
    )
    daemon_pid = plain.run(spec("exec-3:1", package, "jobs:daemon"))["output"]
    assert plain.reset()["clean"] is True
    assert not proc_alive(daemon_pid)


def test_cancel_while_the_package_is_still_downloading(agent: AgentProcess) -> None:
    release = threading.Event()

    class Stalling(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            release.wait(10)
            self.send_response(500)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stalling)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        pkg = {"url": f"http://127.0.0.1:{server.server_address[1]}/slow.zip", "digest": "a" * 64}
        assert agent.call("POST", "/attempts", spec("stall-1:1", pkg, "x:f"))[0] == 202
        time.sleep(0.2)
        start = time.monotonic()
        status, body = agent.call("DELETE", "/attempts/stall-1:1")
        assert status == 200
        assert time.monotonic() - start < 3
        assert body["state"] == "cancelled" and body["error"]["class"] == "Cancelled"
        assert body["exit_code"] is None and body["first_instruction"] is None
        assert agent.call("GET", "/healthz")[1]["busy"] is False
    finally:
        release.set()
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_package_server_that_fails_briefly_is_retried(
    agent: AgentProcess, tmp_path: Path
) -> None:
    _, digest = make_zip(tmp_path / "flaky.zip", {"flaky.py": "def f(x):\n    return 'ok'\n"})
    failures = [503, 502]

    class Flaky(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, directory=str(tmp_path), **kwargs)

        def do_GET(self) -> None:
            if failures:
                self.send_response(failures.pop())
                self.end_headers()
                return
            super().do_GET()

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        pkg = {"url": f"http://127.0.0.1:{server.server_address[1]}/flaky.zip", "digest": digest}
        assert agent.run(spec("flaky-1:1", pkg, "flaky:f"))["output"] == "ok"
        assert failures == []
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_a_reset_during_a_job_cancels_it_first(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    assert agent.call("POST", "/attempts", spec("rs-1:1", package, "jobs:sleep", 30))[0] == 202
    time.sleep(0.2)
    assert agent.reset()["clean"] is True
    result = agent.call("GET", "/attempts/rs-1:1")[1]
    assert result["state"] == "cancelled" and result["error"]["class"] == "Cancelled"
    assert agent.call("GET", "/healthz")[1]["busy"] is False


def test_a_cancel_that_overtakes_its_attempt_cancels_it_when_it_comes(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    """The broker's DELETE can reach the agent before the POST that starts the attempt (a
    caller's cancel while the job is being launched): the attempt is cancelled as it starts,
    never run, and the pod is free for the next."""
    assert agent.call("DELETE", "/attempts/early-1:1")[0] == 404  # not known yet
    start = time.monotonic()
    answer = agent.run(spec("early-1:1", package, "jobs:sleep", 30))
    assert time.monotonic() - start < 10
    assert answer["state"] == "cancelled" and answer["error"]["class"] == "Cancelled", answer
    assert agent.run(spec("early-2:1", package, "jobs:echo", 2))["state"] == "succeeded"


def test_cancels_at_any_moment_never_mix_up_later_jobs(
    agent: AgentProcess, package: dict[str, str]
) -> None:
    for i in range(10):
        body = spec(f"race-{i}:1", package, "jobs:sleep", 30)
        assert agent.call("POST", "/attempts", body)[0] == 202
        time.sleep(0.002 * i)  # land the cancel in binding, spawning or running
        cancelled = agent.call("DELETE", f"/attempts/race-{i}:1")[1]
        assert cancelled["state"] == "cancelled", cancelled
        echoed = agent.run(spec(f"after-{i}:1", package, "jobs:echo", i))
        assert echoed["state"] == "succeeded" and echoed["output"]["input"] == i, echoed
    assert agent.reset()["clean"] is True


def test_a_cached_package_rewritten_by_a_job_is_not_trusted(
    agent: AgentProcess, tmp_path: Path
) -> None:
    url, digest = make_zip(tmp_path / "good.zip", {"good.py": "def f(x):\n    return 'good'\n"})
    pkg = {"url": url, "digest": digest}
    assert agent.run(spec("poison-1:1", pkg, "good:f"))["output"] == "good"
    evil = tmp_path / "evil.zip"
    make_zip(evil, {"good.py": "def f(x):\n    return 'evil'\n"})
    cached = agent.pod_dir / "cache" / "blobs" / digest
    cached.write_bytes(evil.read_bytes())  # what a job of this pod could do
    assert agent.run(spec("poison-2:1", pkg, "good:f"))["output"] == "good"
    assert cached.read_bytes() == (tmp_path / "good.zip").read_bytes()
