"""The broker keeps a job's output as JSON text (``JsonText``), serialized once when the agent
answers: the store holds that text and every answer embeds it, so reading a job never builds
its output again. An output past the nesting limit, which only a job that forged its agent's
answer can send, fails the attempt instead of reaching the store and every listing."""

from __future__ import annotations

import orjson
import pytest

from broker.executor import ERROR_FIELD_CHARS, ERROR_FIELDS, Outcome
from broker.jobs import Job, JsonText, output_value
from functions.nesting import MAX_NESTING, ORJSON_MAX_DEPTH, json_within
from pool_manager.states import JobState


def _agent(output: object) -> dict[str, object]:
    return {"attempt_id": "j:1", "state": "succeeded", "output": output, "exit_code": 0}


def _nest(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


def test_an_output_is_kept_as_its_json_text_and_answered_as_it_is() -> None:
    value = {"b": [1, 2.5, "é", None], "a": {"n": 2**63 - 1}}
    outcome = Outcome.from_agent(_agent(value))
    assert outcome.state == "succeeded"
    assert outcome.output == JsonText(orjson.dumps(value).decode())
    assert output_value(outcome.output) == value
    job = Job(id="j", function="f", version=1, caller="c", sku="cpu", input=None,
              state=JobState.SUCCEEDED, output=outcome.output)  # fmt: skip
    assert orjson.loads(orjson.dumps(job.to_public()))["output"] == value
    assert Outcome.from_agent(_agent(None)).output is None


@pytest.mark.parametrize("levels", [MAX_NESTING, MAX_NESTING + 1, ORJSON_MAX_DEPTH + 10])
def test_an_output_past_the_nesting_limit_fails_the_attempt(levels: int) -> None:
    outcome = Outcome.from_agent(_agent(_nest(levels)))
    if levels <= MAX_NESTING:
        assert outcome.state == "succeeded" and output_value(outcome.output) == _nest(levels)
        return
    assert (outcome.state, outcome.output) == ("failed", None)
    assert outcome.error is not None and outcome.error["class"] == "FunctionError"
    assert f"past {MAX_NESTING} levels" in outcome.error["message"]


def test_the_text_is_what_orjson_writes_for_the_value() -> None:
    for value in (0, "x", [], {}, [[1], {"a": []}], _nest(MAX_NESTING)):
        assert json_within(value) == orjson.dumps(value)
    with pytest.raises(ValueError):
        json_within(_nest(MAX_NESTING + 1))
    with pytest.raises(ValueError):
        json_within({1j})  # not JSON data


def test_a_listing_entry_says_when_its_output_was_left_out() -> None:
    job = Job(id="j", function="f", version=1, caller="c", sku="cpu", input=None,
              state=JobState.SUCCEEDED, output_omitted=True)  # fmt: skip
    assert job.to_public()["output_omitted"] is True and job.to_public()["output"] is None
    assert "output_omitted" not in Job(id="j", function="f", version=1, caller="c",
                                       sku="cpu", input=None).to_public()  # fmt: skip


def test_an_error_is_kept_bounded_whatever_the_agent_sent() -> None:
    """A function's 15 MB exception message was stored twice per job (job and attempt) and
    read by every listing: a thousand of them took the broker to some 30 GB."""
    sent = {"class": "FunctionError", "message": "x" * 15_000_000, "traceback": "t" * 10}
    sent.update({f"extra{i}": "y" for i in range(20)})
    error = Outcome.from_agent({"state": "failed", "error": sent}).error
    assert error is not None and len(error) == ERROR_FIELDS
    assert error["class"] == "FunctionError" and error["traceback"] == "t" * 10
    assert len(error["message"]) < ERROR_FIELD_CHARS + 64
    assert error["message"].endswith(f"[{15_000_000 - ERROR_FIELD_CHARS} more characters]")
    odd = Outcome.from_agent({"state": "failed", "error": ["not", "a", "dict"]}).error
    assert odd == {"class": "InternalError", "message": "['not', 'a', 'dict']"}
