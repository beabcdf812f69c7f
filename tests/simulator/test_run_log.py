"""``--log FILE`` of the real-broker benchmarks: every finished run is on disk before the next
starts, a crash mid-write costs only that line, and a rerun resumes instead of starting over."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.run_log import RunLog

CAMPAIGN = {"benchmark": "loops", "arms": ["reuse-on", "fresh"], "scale": 0.25}
RUN = {"makespan_s": 6.5, "paths": {"warm": 9, "new": 1}, "starts": [0.5, 0.004]}


def test_a_finished_run_is_read_back_by_the_next_campaign_process(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    log = RunLog(path, CAMPAIGN)
    assert log.done == {}
    log.add(0, "reuse-on", RUN)
    assert RunLog(path, CAMPAIGN).done == {(0, "reuse-on"): RUN}
    assert json.loads(path.read_text().splitlines()[0]) == {"campaign": CAMPAIGN}


def test_a_line_torn_by_a_crash_is_dropped_and_the_log_stays_whole(tmp_path: Path) -> None:
    path = tmp_path / "runs.jsonl"
    RunLog(path, CAMPAIGN).add(0, "reuse-on", RUN)
    with path.open("a") as f:
        f.write('{"repeat":0,"arm":"fresh","run":{"makes')  # the process died here
    log = RunLog(path, CAMPAIGN)
    assert list(log.done) == [(0, "reuse-on")]
    log.add(0, "fresh", RUN)
    assert RunLog(path, CAMPAIGN).done == {(0, "reuse-on"): RUN, (0, "fresh"): RUN}
    torn_campaign = tmp_path / "torn.jsonl"
    torn_campaign.write_text('{"campaign":{"bench')
    assert RunLog(torn_campaign, CAMPAIGN).done == {}
    assert json.loads(torn_campaign.read_text()) == {"campaign": CAMPAIGN}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"campaign":{"benchmark":"loops","arms":["reuse-on"],"scale":0.25}}\n',
         "another campaign: arms was ['reuse-on'], now ['reuse-on', 'fresh']"),
        ('{"repeat":0,"arm":"fresh","run":{}}\n', "its first line names no campaign"),
        ('{"campaign":{"benchmark":"loops","arms":["reuse-on","fresh"],"scale":0.25}}\n'
         "not json\n", "line 2"),
        ('{"campaign":{"benchmark":"loops","arms":["reuse-on","fresh"],"scale":0.25}}\n'
         '{"repeat":0}\n', "line 2: a run line needs repeat, arm and run"),
    ],
)  # fmt: skip
def test_a_log_of_another_campaign_or_no_log_at_all_is_refused(
    tmp_path: Path, content: str, message: str
) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match="--log") as exc:
        RunLog(path, CAMPAIGN)
    assert message in str(exc.value)
    assert path.read_text() == content  # untouched


def test_a_log_that_cannot_be_written_is_refused_before_any_run(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="Is a directory"):
        RunLog(tmp_path, CAMPAIGN)
    with pytest.raises(ValueError, match="No such file"):
        RunLog(tmp_path / "missing" / "runs.jsonl", CAMPAIGN)


def _loops(log: Path, repeats: int) -> tuple[dict[str, object], str]:
    argv = [sys.executable, "-m", "benchmarks.loops", "--workload", "w-agent", "--agents", "1",
            "--arms", "reuse-on", "--scale", "0.05", "--settle", "0", "--repeats", str(repeats),
            "--log", str(log), "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, check=True)
    return json.loads(done.stdout), done.stderr


def test_the_loops_benchmark_resumes_from_its_log_on_a_real_broker(tmp_path: Path) -> None:
    """A second invocation with more repeats runs only the new repeat; a third, nothing (no
    broker is started), and reports the same makespans."""
    log = tmp_path / "runs.jsonl"
    first, _ = _loops(log, 1)
    second, err = _loops(log, 2)
    (one,) = first["arms"]["reuse-on"]["makespan_s"]  # type: ignore[index]
    both = second["arms"]["reuse-on"]["makespan_s"]  # type: ignore[index]
    assert both[0] == one and len(both) == 2 and both[1] > 0
    assert "1 runs from" in err and "repeat 1 reuse-on: makespan" not in err
    assert "repeat 2 reuse-on: makespan" in err
    third, err = _loops(log, 2)
    assert third["arms"] == second["arms"] and "makespan" not in err.split("runs from")[-1]
    assert len(log.read_text().splitlines()) == 3  # the campaign and two runs
