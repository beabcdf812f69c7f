"""``benchmarks.invoke --write-venue``: the real broker's warm-path costs into a venue file."""

from __future__ import annotations

import shutil
from pathlib import Path

from benchmarks.invoke import run, write_venue
from simulator.venue import VENUE_DIR, load_venue


def test_measured_warm_costs_replace_the_venues_and_keep_the_rest(tmp_path: Path) -> None:
    """A real broker on local pods: each warm call's timings split into submit -> claim,
    claim -> the pod's agent, agent -> first instruction, and the venue file takes them as
    ``accept_s``, ``handoff`` and ``first_instruction`` (``dispatch_s`` 0: the commit is
    inside the hand-off), exit -> answered as ``reset_s``, while the pod starts ``calibrate``
    measured stay."""
    result = run(calls=12, warmup=2, new_pod_calls=1, progress=False)
    p50, p90 = result["warm_phase_p50_ms"], result["warm_phase_p90_ms"]
    for key in ("submit_to_start", "start_to_pod", "pod_to_first_instruction", "exit_to_answer"):
        assert 0 < p50[key] <= p90[key] < 1000, key  # milliseconds, each measured
    # the two parts add up to the whole, call by call, so neither median exceeds its median
    whole = p50["start_to_first_instruction"]
    assert max(p50["start_to_pod"], p50["pod_to_first_instruction"]) <= whole

    path = tmp_path / "local.yaml"
    shutil.copy(VENUE_DIR / "local.yaml", path)
    write_venue(path, result)
    venue, shipped = load_venue(str(path)), load_venue("local")
    assert venue.accept_s == round(p50["submit_to_start"] / 1000, 5) and venue.dispatch_s == 0
    assert venue.handoff.median == round(p50["start_to_pod"] / 1000, 5)
    assert venue.first_instruction.p90 == round(p90["pod_to_first_instruction"] / 1000, 5)
    assert venue.reset_s == round(p50["exit_to_answer"] / 1000, 5)
    assert venue.start_phases == shipped.start_phases and venue.termination == shipped.termination
    assert "benchmarks.invoke" in venue.notes["handoff"]
