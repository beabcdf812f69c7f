"""``firepool simulate calibrate`` fits the venue's start contention to the engine's model."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from simulator.arms import parse_arm
from simulator.calibrate import contention_per_pod
from simulator.engine import Simulation
from simulator.venue import Dist, load_venue
from simulator.workloads import Batch, Program


def _burst(n: int) -> Program:
    yield Batch(tuple(0.001 for _ in range(n)))


@pytest.mark.parametrize("burst", [2, 4, 8])
def test_a_simulated_burst_starts_as_slowly_as_the_measured_one(burst: int) -> None:
    """Measured: one pod alone takes 1 s, ``burst`` pods at once 1.9 s at the median. With
    the fitted contention, ``burst`` jobs submitted together on an empty pool (each needing
    a new pod, all created in one pass) wait 1.9 s too: every one of them, as pods started
    together are ready together (not the first at 1 s and the last at 2.8 s)."""
    c = contention_per_pod(1.0, 1.9, burst)
    venue = replace(
        load_venue("local"), start_phases={"start": Dist(1.0, 1.0)}, start_contention=c,
        accept_s=0.0, dispatch_s=0.0, handoff=Dist(0.0, 0.0), first_instruction=Dist(0.0, 0.0),
    )  # fmt: skip
    sim = Simulation(venue, parse_arm("fresh"), seed=1)
    sim.add("caller", _burst(burst))
    result = sim.run()
    starts = [job.first - job.submitted for job in result.jobs]
    assert result.pods_created == burst
    assert statistics.median(starts) == pytest.approx(1.9, rel=1e-9)
    assert min(starts) == pytest.approx(max(starts), rel=1e-9)


def test_no_slower_together_is_no_contention() -> None:
    assert contention_per_pod(1.0, 0.95, 4) == 0.0
    assert contention_per_pod(0.5, 0.8, 4) == pytest.approx(0.2)  # 1 + 0.2 * 3 = 1.6
