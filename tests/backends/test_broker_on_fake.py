"""A whole broker runs on the fake pod backend (``FIREPOOL_BACKEND=fake``): the real app,
store, dispatcher, executor and agent protocol, served in-process (``tests/inprocess.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.service import Broker
from broker.settings import Settings
from functions.errors import InvalidRequest
from pool_manager.backends.fake import FakeBackend
from pool_manager.backends.local import LocalBackend
from tests.conftest import BEHAVIOURS, EXAMPLES
from tests.inprocess import inprocess_broker


async def test_a_deployed_function_is_invoked_and_answers_its_output(tmp_path: Path) -> None:
    async with inprocess_broker(tmp_path) as fp:
        assert isinstance(fp.broker.backend, FakeBackend)
        registered = await fp.deploy(EXAMPLES / "noop", name="noop", entrypoint="noop:noop")
        assert registered["name"] == "noop"
        answer = await fp.client.post(
            "/v1/functions/noop:invoke", json={"input": {"n": 7}}, headers=fp.headers("alice")
        )
        assert answer.status_code == 200, answer.text
        job = answer.json()
        assert (job["state"], job["output"], job["caller"]) == ("SUCCEEDED", {"n": 7}, "alice")
        again = await fp.client.post(
            "/v1/functions/noop:invoke", json={"input": 8}, headers=fp.headers("alice")
        )
        assert again.json()["output"] == 8
        assert again.json()["acquisition"]["path"] == "warm"  # the pod was reset and kept


async def test_a_failing_function_fails_the_job_with_its_traceback_in_the_log(
    tmp_path: Path,
) -> None:
    async with inprocess_broker(tmp_path) as fp:
        await fp.deploy(BEHAVIOURS, name="fail", entrypoint="behaviours:fail", max_retries=0)
        headers = fp.headers("alice")
        job = (await fp.client.post("/v1/functions/fail:invoke", json={"input": 3},
                                    headers=headers)).json()  # fmt: skip
        assert job["state"] == "FAILED" and job["error"]["class"] == "FunctionError", job
        assert "bad input: 3" in job["error"]["message"]
        log = await fp.client.get(f"/v1/jobs/{job['id']}/logs", headers=headers)
        assert "Traceback" in log.text and "ValueError: bad input: 3" in log.text, log.text


def test_an_unknown_backend_is_one_clear_error_naming_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match=r"unknown pod backend 'k8s'.*local, fake"):
        Broker(Settings(home=tmp_path / "home", backend="k8s"))


def test_the_default_backend_is_local_pods(tmp_path: Path) -> None:
    assert isinstance(Broker(Settings(home=tmp_path / "home")).backend, LocalBackend)
