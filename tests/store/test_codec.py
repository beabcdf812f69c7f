"""Every job and function spec survives encoding to row values and back, bit for bit."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.jobs import Attempt, Job, JsonText, output_value
from broker.store.codec import function_from_row, function_row, job_from_row, job_row
from functions.spec import FunctionSpec
from pool_manager.states import JobState

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
times = st.none() | st.floats(0, 4e9)
errors = st.none() | st.fixed_dictionaries({"class": st.text(), "message": st.text()})
attempts = st.builds(
    Attempt,
    id=st.text(min_size=1),
    pods=st.lists(st.text(min_size=1), max_size=3),
    exit_code=st.none() | st.integers(-255, 255),
    started=times,
    finished=times,
    error=errors,
)
jobs = st.builds(
    Job,
    id=st.text(min_size=1, max_size=64),
    function=st.text(min_size=1),
    version=st.integers(1, 10_000),
    caller=st.text(min_size=1),
    sku=st.text(min_size=1),
    input=json_values,
    state=st.sampled_from(JobState),
    revision=st.integers(0, 1000),
    lease_tag=st.none() | st.text(),
    queue=st.text(),
    priority=st.integers(-100, 100),
    timeout_s=times,
    max_retries=st.integers(0, 10),
    pods_needed=st.integers(1, 64),
    output=json_values,
    error=errors,
    exit_code=st.none() | st.integers(-255, 255),
    retries=st.integers(0, 10),
    attempts=st.lists(attempts, max_size=3),
    acquisition=st.none()
    | st.fixed_dictionaries({"path": st.text(), "reason": st.none() | st.text()}),
    submitted=st.floats(0, 4e9),
    started=times,
    first_instruction=times,
    finished=times,
    idempotency_key=st.none() | st.text(),
    request_hash=st.none() | st.text(),
)


@settings(max_examples=100, deadline=None)
@given(jobs)
def test_a_job_round_trips_through_its_row(job: Job) -> None:
    """Every field; the output comes back as its JSON text, and is stored as it is."""
    back = job_from_row(job_row(job))
    assert output_value(back.output) == job.output
    assert dataclasses.replace(back, output=job.output) == job
    if job.output is not None:
        again = job_from_row(job_row(back))
        assert isinstance(again.output, JsonText) and again.output == back.output


@settings(max_examples=50, deadline=None)
@given(
    st.builds(
        FunctionSpec,
        name=st.text(min_size=1),
        sku=st.text(min_size=1),
        package_digest=st.text(min_size=1),
        entrypoint=st.none() | st.text(),
        command=st.none() | st.lists(st.text(), max_size=4).map(tuple),
        requirements_digest=st.none() | st.text(),
        env=st.dictionaries(st.text(), st.text(), max_size=4),
        timeout_s=st.floats(0.1, 86_400),
        max_retries=st.integers(0, 10),
        pods=st.integers(1, 64),
        single_use=st.booleans(),
        version=st.integers(1, 1000),
        created=st.floats(0, 4e9),
        owner=st.text(),
    )
)
def test_a_function_spec_round_trips_through_its_row(spec: FunctionSpec) -> None:
    assert function_from_row(function_row(spec)) == spec


def test_the_rows_cover_every_field_of_the_models() -> None:
    job = Job(id="j", function="f", version=1, caller="c", sku="s", input=None)
    listing_only = {"output_omitted"}  # a mark ``list_jobs`` sets, never stored
    assert {f.name for f in dataclasses.fields(Job)} - listing_only <= set(job_row(job))
    assert not listing_only & set(job_row(job))
    spec = FunctionSpec(name="f", sku="s", package_digest="d", entrypoint="m:f")
    row = function_row(spec)
    asked_only = {"resources"}  # what registration turned into ``sku``, never stored
    assert {f.name for f in dataclasses.fields(FunctionSpec)} - asked_only <= set(row)
