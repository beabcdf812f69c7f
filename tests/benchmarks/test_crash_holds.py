"""How ``benchmarks.crash`` counts owner holds across a kill (``count_holds``), on broker log
lines as the broker writes them (copied from a run). Should the broker's lines change, the
patterns stop matching and the count gets stricter (a hold ended before the kill reads as
not restored), never laxer."""

from __future__ import annotations

from benchmarks.crash import count_holds

T = "2026-12-04 18:00:05,676"
QUEUED = f"{T} firepool.dispatcher job 01a2j1 queued: work v1 for trainer0 on cpu\n"


def started(job: str, pod: str, path: str) -> str:
    return f"{T} firepool.dispatcher job {job} started: attempt {job}:0 on {pod}, path {path}\n"


def test_a_hold_the_broker_broke_between_the_read_and_the_kill_is_not_one_it_had() -> None:
    held = {"cpu-a": "trainer0", "cpu-b": "trainer0", "cpu-c": "agent1"}
    window = (
        f"{T} firepool.access GET /v1/pools 200 0.3 ms ops\n"
        f"{T} firepool.pods deleting pod cpu-a: hold_broken\n"
        + started("01a2j9", "cpu-c", "recycled (tag_changed)")
    )
    at_kill, restored, ended = count_holds(held, {}, window, "", {})
    assert ended == {"cpu-a", "cpu-c"}
    assert at_kill == {"cpu-b": "trainer0"} and restored == set()  # cpu-b: lost


def test_a_hold_the_restarted_broker_lost_counts_however_its_log_reads() -> None:
    """The restarted broker's own deletions (a pod it could not reset, one restored as
    retiring) are holds lost: only the killed broker's lines after the read excuse one."""
    held = {"cpu-a": "trainer0", "cpu-b": "trainer0"}
    restart = (
        f"{T} firepool.recovery pod cpu-a did not reset clean after restart ('x'); deleting it\n"
        f"{T} firepool.pods deleting pod cpu-b: restored_retiring\n"
    )
    at_kill, restored, ended = count_holds(held, {}, "", restart, {})
    assert at_kill == held and restored == set() and ended == set()


def test_a_hold_is_restored_if_the_owner_has_the_pod_or_its_job_took_it() -> None:
    held = {"cpu-a": "trainer0", "cpu-b": "trainer0", "cpu-c": "trainer0", "cpu-d": "trainer0"}
    after = {"cpu-a": "trainer0", "cpu-b": "agent3"}
    restart = QUEUED + started("01a2j1", "cpu-c", "warm") + started("01a2j2", "cpu-d", "warm")
    callers = {"01a2j1": "trainer0", "01a2j2": "agent3"}
    at_kill, restored, _ = count_holds(held, after, "", restart, callers)
    assert at_kill == held
    assert restored == {"cpu-a", "cpu-c"}  # cpu-b: another owner; cpu-d: another's job
