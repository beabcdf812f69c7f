"""``firepool simulate --report DIR --quick`` end to end: every table, figure and the JSON
are written from a real run, and the progress bar reaches its last step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulator import acceptance
from simulator.report import write_report

_PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_the_quick_report_writes_every_table_and_figure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert write_report(str(tmp_path), quick=True, workers=2) == 0
    err = capsys.readouterr().err
    steps = len(acceptance.ROWS) + len(acceptance.SENSITIVITY) + 6
    assert f"{steps}/{steps}" in err  # the bar on stderr finished

    readme = (tmp_path / "README.md").read_text()
    for row in acceptance.ROWS:
        assert f"| {row.key} |" in readme
    for png in ("table5_6_speedups", "fig6b_frontier", "fig7_speedup_vs_body",
                "fig5_fragmentation"):  # fmt: skip
        assert f"({png}.png)" in readme
        assert (tmp_path / f"{png}.png").read_bytes()[:8] == _PNG

    results = json.loads((tmp_path / "results.json").read_text())
    assert [r["key"] for r in results["acceptance"]] == [r.key for r in acceptance.ROWS]
    for r in results["acceptance"]:
        assert math.isfinite(r["speedup"]) and r["speedup"] > 1.0  # warmth always helps
        assert r["band"] == pytest.approx([0.76 * r["paper"], 1.31 * r["paper"]])
    assert {r["workload"] for r in results["fig7"]} == {"w-rl", "w-agent"}
    assert {r["think_s"] for r in results["fig7_event"]} == {0}
    assert "Event-driven dispatcher of §3" in readme
    assert results["c1"] and results["grid"] and results["fig5"] and results["sensitivity"]
    card = results["scorecard"]
    assert len(card["metrics"]) == len(acceptance.PAPER_METRICS)
    assert f"held out | {'yes' if card['metrics'][0]['within_band'] else 'no'} |" in readme
    assert f"**{card['held_out_within_band']} of {card['held_out']} held-out metrics" in readme
