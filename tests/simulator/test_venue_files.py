"""A venue file (``firepool simulate --venue FILE``) with a missing, unknown or out-of-range
key is a typed error naming the file and the key, checked as ``--set`` checks an override:
never a traceback, a truncated integer or a boolean read as a number."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from simulator.arms import arm_names
from simulator.cli import main as simulate
from simulator.venue import (
    VENUE_DIR,
    Dist,
    check_venue_target,
    load_venue,
    save_venue,
)

H200 = yaml.safe_load((VENUE_DIR / "h200.yaml").read_text())


def _write(tmp_path: Path, data: object) -> str:
    path = tmp_path / "venue.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _edited(**changes: object) -> dict[str, object]:
    data = {**H200, "pool": dict(H200["pool"])}
    for key, value in changes.items():
        if key.startswith("pool_"):
            data["pool"][key.removeprefix("pool_")] = value
        elif value is None:
            del data[key]
        else:
            data[key] = value
    return data


def test_a_copy_of_a_shipped_venue_loads_as_the_shipped_one(tmp_path: Path) -> None:
    assert load_venue(_write(tmp_path, H200)) == load_venue("h200")


def test_a_duration_is_a_number_or_a_median_with_an_optional_p90(tmp_path: Path) -> None:
    venue = load_venue(_write(tmp_path, _edited(termination=45, handoff={"median": 0.4})))
    assert venue.termination == Dist(45.0, 45.0) and venue.handoff == Dist(0.4, 0.4)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"pool": None}, "missing venue key 'pool'"),
        ({"start_phases": None}, "missing venue key 'start_phases'"),
        ({"colour": 1}, "unknown venue key 'colour'"),
        ({"pool_colour": 1}, "unknown pool key 'colour'"),
        ({"pool": {"max_count": 2}}, "missing pool key 'sku'"),
        ({"pool": [1, 2]}, "pool: a mapping of keys"),
        ({"budget": "two"}, "budget: 'two' is not an integer"),
        ({"budget": 2.5}, "budget: 2.5 is not an integer"),
        ({"budget": 0}, "budget must be at least 1"),
        ({"gpus_per_node": -1}, "gpus_per_node: -1 must be a finite number >= 0"),
        ({"reset_s": True}, "reset_s: True is not a number"),
        ({"reconcile_s": float("nan")}, "reconcile_s: nan must be a finite number >= 0"),
        ({"termination": {"median": 60, "p90": 50}}, "termination: p90 50 is below the median"),
        ({"handoff": {"mean": 0.4}}, "handoff: a number or {median, p90}"),
        ({"start_phases": {"boot": -3}}, "start_phases.boot: -3 must be a finite number >= 0"),
        ({"dispatch_mode": "batch"}, "dispatch_mode: 'event' or 'tick', not 'batch'"),
        ({"pool_step": 0}, "pool 'h200': step must be a whole number >= 1"),
        ({"notes": "none"}, "notes: a mapping of keys"),
    ],
)
def test_a_bad_venue_file_names_the_file_and_the_key(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    path = _write(tmp_path, _edited(**changes))
    with pytest.raises(ValueError, match="venue file") as exc:
        load_venue(path)
    assert path in str(exc.value) and message in str(exc.value)


def test_a_file_that_is_not_a_venue_is_refused(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [\n")
    with pytest.raises(ValueError, match=r"is not valid YAML \(line 2, column 1\)"):
        load_venue(str(broken))
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    with pytest.raises(ValueError, match="a venue is a mapping of keys, not list"):
        load_venue(str(listed))
    with pytest.raises(ValueError, match="No such file"):
        load_venue(str(tmp_path / "missing.yaml"))
    with pytest.raises(ValueError, match="Is a directory"):
        load_venue(str(tmp_path))
    with pytest.raises(ValueError, match="unknown venue 'nope'; shipped: h200"):
        load_venue("nope")


def test_the_cli_exits_2_on_a_bad_venue_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, _edited(budget="two"))
    assert simulate(["--venue", path, "--repeats", "1", "--json"]) == 2
    captured = capsys.readouterr()
    assert "budget: 'two' is not an integer" in captured.err and captured.out == ""


def test_an_arm_named_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="arm 'reuse-on' is named twice"):
        arm_names("reuse-on,reuse-off, reuse-on")
    assert simulate(["--arms", "fresh,fresh", "--repeats", "1"]) == 2
    assert "arm 'fresh' is named twice" in capsys.readouterr().err


def test_a_report_directory_that_cannot_be_made_fails_before_any_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "taken"
    a_file.write_text("")
    assert simulate(["--report", str(a_file)]) == 2
    assert simulate(["--report", str(a_file / "below")]) == 2
    err = capsys.readouterr().err
    assert f"--report {a_file}: File exists" in err
    assert f"--report {a_file / 'below'}: Not a directory" in err


def test_a_measurement_refuses_a_target_it_could_not_write_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``calibrate --out`` exits 2 in a moment, not after half a minute of pod starts."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_edited(budget="two")))
    for out in (bad, tmp_path / "no-folder" / "local.yaml"):
        with pytest.raises(SystemExit) as exc:
            simulate(["calibrate", "--pods", "2", "--burst", "2", "--out", str(out)])
        assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "budget: 'two' is not an integer" in err and "no writable folder" in err
    with pytest.raises(ValueError, match="No such file"):
        check_venue_target(tmp_path / "new.yaml", new_ok=False)
    check_venue_target(tmp_path / "new.yaml")  # calibrate may start a new file


def test_saving_a_venue_checks_it_and_never_leaves_half_a_file(tmp_path: Path) -> None:
    path = tmp_path / "local.yaml"
    save_venue(path, H200)
    assert load_venue(str(path)) == load_venue("h200")
    before = path.read_text()
    with pytest.raises(ValueError, match="termination: p90 1 is below the median 2"):
        save_venue(path, _edited(termination={"median": 2, "p90": 1}))
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == ["local.yaml"]
