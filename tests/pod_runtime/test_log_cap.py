"""The log cap (``pod_runtime.log_cap``): a log over its cap keeps its start and its end, with
one line between them saying how many bytes were dropped, and a reader sees the same bytes at
the same offsets while the job runs and after it ended."""

from __future__ import annotations

import base64
import re
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from pod_runtime.log_cap import cap_log, cut_slack, servable_while_running
from tests.pod_runtime.conftest import AgentProcess, make_zip

MARKER = re.compile(rb"\[firepool\] (\d+) bytes of this log dropped here: a log over (\d+) bytes")


def numbered_lines(count: int, width: int = 50) -> bytes:
    return b"".join(b"line %06d " % i + b"x" * (width - 13) + b"\n" for i in range(count))


def split_capped(capped: bytes) -> tuple[bytes, bytes, bytes]:
    """``(head, marker line, tail)`` of a capped log."""
    match = MARKER.search(capped)
    assert match is not None, capped[-200:]
    start = match.start()
    end = capped.index(b"\n", start) + 1
    return capped[:start], capped[start:end], capped[end:]


def test_a_log_over_the_cap_keeps_its_start_and_its_end_cut_at_line_boundaries(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    original = numbered_lines(10_000)  # 500 kB
    log.write_bytes(original)
    cap = 100_000
    served = cap_log(log, cap)
    capped = log.read_bytes()
    assert served == len(capped) <= cap + 120
    head, marker, tail = split_capped(capped)
    assert original.startswith(head) and head.endswith(b"\n")
    assert original.endswith(tail) and tail.startswith(b"line ")  # whole lines only
    assert cap // 2 - cut_slack(cap) <= len(head) <= cap // 2
    assert len(head) + len(tail) <= cap
    match = MARKER.search(marker)
    assert match is not None and int(match[2]) == cap
    assert int(match[1]) == len(original) - len(head) - len(tail), "says what it dropped"
    assert tail.endswith(b"line 009999 " + b"x" * 37 + b"\n"), "the end is where the error is"


def test_a_cut_without_a_newline_near_falls_at_the_half_and_the_marker_has_its_own_line(
    tmp_path: Path,
) -> None:
    log = tmp_path / "log"
    original = b"y" * 300_000  # one line, no newline at all
    log.write_bytes(original)
    cap_log(log, 100_000)
    head, marker, tail = split_capped(log.read_bytes())
    assert head == b"y" * 50_000 + b"\n"  # the marker starts a line of its own
    assert tail == b"y" * 50_000
    assert marker.endswith(b"\n") and b"200000 bytes" in marker


def test_a_log_within_the_cap_is_kept_whole(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_bytes(numbered_lines(100))
    assert cap_log(log, 5000) == 5000 == len(log.read_bytes())
    assert log.read_bytes() == numbered_lines(100)
    assert cap_log(tmp_path / "missing", 5000) == 0


@settings(max_examples=60, deadline=None)
@given(
    lines=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=60),
    cap=st.integers(min_value=16, max_value=4000),
)
def test_what_a_running_log_serves_is_at_the_same_offsets_in_the_capped_log(
    lines: list[int], cap: int
) -> None:
    """Whatever a reader was served of the log while the job ran (at any size it had) is
    the start of what it reads once the job ended."""
    text = b"".join(b"z" * n + b"\n" for n in lines)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log"
        served_while_running: list[bytes] = []
        with log.open("wb") as out:
            for size in range(0, len(text) + 1, max(1, len(text) // 25)):
                out.seek(0)
                out.write(text[:size])
                out.flush()
                with log.open("rb") as f:
                    n = servable_while_running(f, size, cap)
                    f.seek(0)
                    served_while_running.append(f.read(n))
        log.write_bytes(text)
        final = log.read_bytes()[: cap_log(log, cap)]
    for served in served_while_running:
        assert final.startswith(served), (served, final)


TRACEBACK_JOB = """
import sys, time

def loud_then_fail(n):
    for i in range(n):
        print(f"step {i:07d}", flush=i % 1000 == 0)
    sys.stdout.flush()
    time.sleep(0.5)
    raise RuntimeError("the end of the log says why")
"""


def test_a_failed_jobs_traceback_survives_the_cap_and_reads_at_the_same_offsets(
    agent_factory: Callable[..., AgentProcess],
) -> None:
    cap = 50_000
    agent = agent_factory("--max-log-bytes", str(cap), name="capped")
    url, digest = make_zip(agent.pod_dir / "loud.zip", {"loud.py": TRACEBACK_JOB})
    spec = {"attempt_id": "loud-1:1", "package": {"url": url, "digest": digest},
            "entrypoint": "loud:loud_then_fail", "input": 20_000}  # fmt: skip
    status, _ = agent.call("POST", "/attempts", spec)
    assert status == 202
    read, offset = b"", 0
    while True:  # follow it as the broker does, live first, then once it ended
        status, chunk = agent.call(
            "GET", f"/attempts/loud-1:1/logs?offset={offset}&encoding=base64"
        )
        assert status == 200, chunk
        read += base64.b64decode(chunk["data"])
        offset = chunk["offset"]
        assert offset == len(read)
        if chunk["done"]:
            break
        time.sleep(0.02)
    result = agent.call("GET", "/attempts/loud-1:1")[1]
    assert result["state"] == "failed", result
    head, _, tail = split_capped(read)
    assert head.startswith(b"step 0000000\n")
    assert b"RuntimeError: the end of the log says why" in tail
    assert read == (agent.pod_dir / "attempts" / "loud-1:1" / "log").read_bytes()
