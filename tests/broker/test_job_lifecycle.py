"""A job's state changes only along JOB_TRANSITIONS (moves) and JOB_UNDOS (undoing a move the
store did not record); anything else raises IllegalTransition. No code but ``Job`` assigns a
job's state, so these tables hold every edge the broker takes."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sqlalchemy.exc import OperationalError

from broker.jobs import Job
from pool_manager.states import JOB_TRANSITIONS, JOB_UNDOS, IllegalTransition, JobState
from tests.conftest import EXAMPLES
from tests.inprocess import inprocess_broker

states = st.sampled_from(list(JobState))


def make_job(state: JobState) -> Job:
    return Job(id="j", function="f", version=1, caller="c", sku="cpu", input=None, state=state)


@given(states, states)
def test_a_job_moves_only_along_the_transitions_table(old: JobState, new: JobState) -> None:
    job = make_job(old)
    if new in JOB_TRANSITIONS[old]:
        job.move_to(new)
        assert job.state is new
    else:
        with pytest.raises(IllegalTransition):
            job.move_to(new)
        assert job.state is old


@given(states, states)
def test_a_job_is_undone_only_along_the_undo_table(old: JobState, durable: JobState) -> None:
    job = make_job(old)
    if durable is old or durable in JOB_UNDOS[old]:
        job.undo_to(durable)
        assert job.state is durable
    else:
        with pytest.raises(IllegalTransition):
            job.undo_to(durable)
        assert job.state is old


def test_every_undo_reverses_a_move_of_the_table() -> None:
    for state, durables in JOB_UNDOS.items():
        for durable in durables:
            assert state in JOB_TRANSITIONS[durable], (durable, state)


def test_a_terminal_job_never_moves_again() -> None:
    for state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
        assert not JOB_TRANSITIONS[state]


ENGINE = Path(__file__).resolve().parents[2]
JOB_MODULE = ENGINE / "broker" / "jobs.py"


def _state_assignments(path: Path) -> list[str]:
    """Every ``X.state = JobState...`` (plain, tuple or annotated) in ``path``, and every
    ``.state`` assignment to a name that holds a job (``job``, ``live``, ``fresh``) or to
    ``self`` (no class of the broker but ``Job`` has a ``state`` of its own)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Assign):
            pairs: list[tuple[ast.expr, ast.expr | None]] = []
            for target in node.targets:
                if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    pairs.extend(zip(target.elts, node.value.elts, strict=False))
                else:
                    pairs.append((target, node.value))
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            pairs = [(node.target, node.value)]
        else:
            continue
        for target, value in pairs:
            if not (isinstance(target, ast.Attribute) and target.attr == "state"):
                continue
            holder = target.value.id if isinstance(target.value, ast.Name) else ""
            names_job_state = value is not None and "JobState" in ast.unparse(value)
            if names_job_state or holder in ("job", "live", "fresh", "self"):
                found.append(f"{path.relative_to(ENGINE)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_but_the_job_itself_assigns_a_jobs_state() -> None:
    """Every state change goes through ``Job.move_to`` / ``Job.undo_to``, so the table tests
    above cover every edge the broker takes."""
    sources = [p for d in ("broker", "gateway") for p in sorted((ENGINE / d).rglob("*.py"))]
    assert JOB_MODULE in sources
    outside = [hit for p in sources if p != JOB_MODULE for hit in _state_assignments(p)]
    assert outside == []
    assert len(_state_assignments(JOB_MODULE)) == 2, "the guard no longer sees move_to/undo_to"


ONE_POD_POOL = "pools:\n  cpu: {min_count: 0, max_count: 1}\n"


async def test_a_cancel_the_store_does_not_record_leaves_the_job_queued_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The in-memory CANCELLED is undone to QUEUED (``JOB_UNDOS``) when its commit fails:
    the job reads and stays queued, and a later cancel that the store takes ends it."""
    async with inprocess_broker(tmp_path, catalog=ONE_POD_POOL) as fp:
        await fp.deploy(EXAMPLES / "noop", name="noop", entrypoint="noop:noop")
        await fp.deploy(EXAMPLES / "noop", name="sleeper", command=["sleep", "60"])
        headers = fp.headers("alice")

        async def submit(name: str) -> str:
            answer = await fp.client.post(f"/v1/functions/{name}/jobs", json={}, headers=headers)
            assert answer.status_code == 202, answer.text
            return f"/v1/jobs/{answer.json()['job_id']}"

        async def state(url: str) -> str:
            return str((await fp.client.get(url, headers=headers)).json()["state"])

        sleeper = await submit("sleeper")
        while await state(sleeper) != "RUNNING":  # it holds the pool's one pod
            await asyncio.sleep(0.01)
        queued = await submit("noop")
        store = fp.broker.jobs
        real_update = store.update

        async def refuse_cancels(job: Job, revision: int) -> Any:
            if job.state is JobState.CANCELLED:
                raise OperationalError("UPDATE ...", {}, Exception("database is locked"))
            return await real_update(job, revision)

        monkeypatch.setattr(store, "update", refuse_cancels)
        job = await fp.broker.get_job(queued.rpartition("/")[2])
        assert job is not None
        with pytest.raises(OperationalError):
            await fp.broker.cancel(job)
        after = (await fp.client.get(queued, headers=headers)).json()
        assert (after["state"], after["error"], after["timings"]["finished"]) == (
            "QUEUED", None, None,
        )  # fmt: skip
        assert job.id in [queued_job.id for queued_job in fp.broker.dispatcher.queued()]
        monkeypatch.setattr(store, "update", real_update)
        cancelled = (await fp.client.delete(queued, headers=headers)).json()
        assert cancelled["state"] == "CANCELLED", cancelled
        stored = await store.get_job(job.id)
        assert stored is not None and stored.state is JobState.CANCELLED
        await fp.client.delete(sleeper, headers=headers)
