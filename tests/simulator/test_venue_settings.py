"""``firepool simulate --set KEY=VALUE``: venue overrides for sensitivity runs."""

from __future__ import annotations

import json

import pytest

from simulator.cli import main
from simulator.venue import Dist, load_venue, with_settings


def test_settings_override_durations_numbers_phases_and_pool_knobs() -> None:
    v = with_settings(
        load_venue("h200"),
        ["job_overhead=0", "termination=45/60", "reconcile_s=5", "budget=4",
         "start_phases.agent_ready=3", "pool.idle_timeout_s=60", "pool.caller_hold_s=none",
         "pool.tag_mode=switch", "pool.max_count=4", "dispatch_mode=tick"],
    )  # fmt: skip
    assert v.job_overhead == Dist(0.0, 0.0)
    assert v.termination == Dist(45.0, 60.0)
    assert v.reconcile_s == 5.0 and v.budget == 4 and v.dispatch_mode == "tick"
    assert v.start_phases["agent_ready"] == Dist(3.0, 3.0)
    assert v.start_phases["platform_init_containers"] == Dist(14.0, 17.0)
    assert (v.pool.idle_timeout_s, v.pool.caller_hold_s) == (60.0, None)
    assert (v.pool.tag_mode, v.pool.max_count) == ("switch", 4)
    assert isinstance(v.pool.max_count, int)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("job_overhead", "KEY=VALUE"),
        ("nope=1", "unknown key 'nope'"),
        ("pool.sku=x", "unknown key 'pool.sku'"),
        ("termination=5/2", "below the median"),
        ("termination=-1", ">= 0"),
        ("reconcile_s=nan", ">= 0"),
        ("budget=2.5", "not an integer"),
        ("accept_s=fast", "not a number"),
        ("pool.tag_mode=sometimes", "retire, switch, hint"),
        ("start_phases.warp=1", "no start phase 'warp'"),
        ("dispatch_mode=batch", "'event' or 'tick'"),
    ],
)
def test_bad_settings_are_rejected_naming_the_key(setting: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        with_settings(load_venue("h200"), [setting])


def test_the_cli_applies_settings_and_reports_bad_ones(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--venue", "h200", "--workload", "standby", "--jobs", "4", "--arms",
            "standby-on,standby-off", "--repeats", "1", "--workers", "1", "--json"]  # fmt: skip
    assert main(base) == 0
    slow = json.loads(capsys.readouterr().out)
    assert main([*base, "--set", "job_overhead=0", "--set", "termination=1"]) == 0
    fast = json.loads(capsys.readouterr().out)
    off = "standby-off"
    assert fast["arms"][off]["makespan_median_s"] < slow["arms"][off]["makespan_median_s"]
    assert main([*base, "--set", "bogus=1"]) == 2
    assert "unknown key 'bogus'" in capsys.readouterr().err
