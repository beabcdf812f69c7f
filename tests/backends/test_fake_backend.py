"""What a fake pod does with an attempt (``pool_manager/backends/fake_run.py``), beyond the
contract every backend keeps (``test_backend_contract.py``): packages by digest, entrypoints
in a thread under their own module names, the real agent's outcomes, commands as processes,
and the test knobs. Each test drives one fake pod through the broker's ``AgentClient``."""

from __future__ import annotations

import asyncio
import io
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import pytest

from broker.agent_client import AgentClient
from functions.errors import InvalidRequest
from functions.packaging import package_digest
from pool_manager.backends.base import CreateFailed
from pool_manager.backends.factory import make_backend
from pool_manager.backends.fake import FakeBackend
from pool_manager.catalog import PoolSpec

CPU = PoolSpec(sku="cpu")


@dataclass
class FakePodUnderTest:
    backend: FakeBackend
    agents: AgentClient
    endpoint: str
    tmp_path: Path
    packages: dict[str, bytes] = field(default_factory=dict)

    def package(self, name: str, files: dict[str, str]) -> str:
        """Store a package of ``files`` (path: source) under its digest; return the digest."""
        root = self.tmp_path / "packages" / name
        for path, source in files.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_text(textwrap.dedent(source))
        digest, data = package_digest(root)
        self.packages[digest] = data
        return digest

    async def run(self, attempt_id: str, digest: str | None, **spec: Any) -> dict[str, Any]:
        """Run an attempt to its end (``wait: true``); its result."""
        package = {"url": "http://unused", "digest": digest} if digest else None
        body = {"attempt_id": attempt_id, "package": package, "timeout_s": 10, "wait": True}
        status, result = await self.agents.start(self.endpoint, {**body, **spec}, timeout=30)
        assert status == 200, result
        return result

    async def log(self, attempt_id: str) -> str:
        chunk = await self.agents.logs(self.endpoint, attempt_id)
        assert chunk is not None
        return chunk.data.decode()

    async def next_job(self, attempt_id: str) -> None:
        """What the broker does between jobs: acknowledge the result, reset the pod."""
        await self.agents.ack(self.endpoint, attempt_id)
        report = await self.agents.reset(self.endpoint)
        assert report["clean"], report


@pytest.fixture
async def pod(tmp_path: Path) -> AsyncIterator[FakePodUnderTest]:
    packages: dict[str, bytes] = {}

    def open_package(digest: str) -> BinaryIO:
        return io.BytesIO(packages[digest])

    backend = FakeBackend(tmp_path / "pods", open_package)
    agents = AgentClient()
    made = await backend.create("cpu-a", CPU)
    try:
        yield FakePodUnderTest(backend, agents, made.endpoint, tmp_path, packages)
    finally:
        await agents.close()
        await backend.shutdown()


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def test_two_packages_with_a_module_of_the_same_name_each_run_their_own(
    pod: FakePodUnderTest,
) -> None:
    """Each package's modules are imported under a prefix of their own: no ``sys.modules``
    entry is shared between packages, and relative imports inside one work."""
    first = pod.package("one", {"handler.py": "from . import util\ndef f(x): return util.V + x\n",
                                "util.py": "V = 100\n"})  # fmt: skip
    second = pod.package("two", {"handler.py": "def f(x):\n    return -x\n"})
    assert (await pod.run("a:1", first, entrypoint="handler:f", input=1))["output"] == 101
    await pod.next_job("a:1")
    assert (await pod.run("b:1", second, entrypoint="handler:f", input=1))["output"] == -1
    import sys

    assert not [name for name in sys.modules if name.startswith("_firepool_fake_")]


async def test_a_package_whose_bytes_do_not_match_its_digest_is_rejected(
    pod: FakePodUnderTest,
) -> None:
    digest = pod.package("one", {"handler.py": "def f(x):\n    return x\n"})
    pod.packages[digest] = pod.packages[digest] + b"tampered"
    result = await pod.run("a:1", digest, entrypoint="handler:f", input=1)
    assert result["state"] == "failed" and result["error"]["class"] == "PackageRejected"


async def test_an_exception_fails_as_function_error_with_its_traceback_in_the_log(
    pod: FakePodUnderTest,
) -> None:
    digest = pod.package("one", {"handler.py": """
        def f(x):
            print("about to fail")
            raise KeyError(x)
        """})  # fmt: skip
    result = await pod.run("a:1", digest, entrypoint="handler:f", input="k")
    assert result["state"] == "failed" and result["exit_code"] is None
    assert result["error"]["class"] == "FunctionError" and result["error"]["type"] == "KeyError"
    assert "raise KeyError(x)" in result["error"]["traceback"]
    log = await pod.log("a:1")
    assert "about to fail" in log and "Traceback" in log and "KeyError: 'k'" in log, log


async def test_a_coroutine_function_is_awaited_and_a_value_json_cannot_carry_fails(
    pod: FakePodUnderTest,
) -> None:
    digest = pod.package("one", {"handler.py": """
        import asyncio
        async def slow_double(x):
            await asyncio.sleep(0.01)
            return 2 * x
        def not_json(x):
            return {1, 2}
        """})  # fmt: skip
    assert (await pod.run("a:1", digest, entrypoint="handler:slow_double", input=4))["output"] == 8
    await pod.next_job("a:1")
    result = await pod.run("b:1", digest, entrypoint="handler:not_json", input=0)
    assert result["error"]["class"] == "FunctionError"
    assert "not JSON-serializable" in result["error"]["message"]


async def test_a_timed_out_function_fails_and_the_pod_resets_unclean_while_its_thread_runs(
    pod: FakePodUnderTest,
) -> None:
    digest = pod.package("one", {"handler.py": "import time\ndef f(x):\n    time.sleep(x)\n"})
    result = await pod.run("a:1", digest, entrypoint="handler:f", input=0.6, timeout_s=0.05)
    assert result["state"] == "failed" and result["error"]["class"] == "Timeout", result
    report = await pod.agents.reset(pod.endpoint)
    assert not report["clean"] and "a:1" in report["reason"], report

    async def clean() -> bool:
        return bool((await pod.agents.reset(pod.endpoint))["clean"])

    assert await eventually(clean)  # once the thread has ended


async def test_a_cancel_ends_the_attempt_cancelled_and_a_busy_pod_refuses_another(
    pod: FakePodUnderTest,
) -> None:
    digest = pod.package("one", {"handler.py": "import time\ndef f(x):\n    time.sleep(x)\n"})
    spec = {"package": {"url": "http://unused", "digest": digest}, "entrypoint": "handler:f",
            "input": 0.3, "timeout_s": 10, "wait": False}  # fmt: skip
    status, _ = await pod.agents.start(pod.endpoint, {"attempt_id": "a:1", **spec}, timeout=10)
    assert status == 202
    status, busy = await pod.agents.start(pod.endpoint, {"attempt_id": "b:1", **spec}, timeout=10)
    assert status == 409 and busy["error"]["class"] == "Conflict", busy
    await pod.agents.cancel(pod.endpoint, "a:1")
    result = await pod.agents.result(pod.endpoint, "a:1")
    assert result is not None and result["state"] == "cancelled", result
    assert result["error"]["class"] == "Cancelled"


async def test_requirements_are_refused_as_the_fake_installs_nothing(
    pod: FakePodUnderTest,
) -> None:
    digest = pod.package("one", {"handler.py": "def f(x):\n    return x\n"})
    requirements = {"url": "http://unused", "digest": "0" * 64}
    result = await pod.run("a:1", digest, entrypoint="handler:f", input=1,
                           requirements=requirements)  # fmt: skip
    assert result["error"]["class"] == "DependencyInstallFailed", result


async def test_a_command_runs_as_a_process_in_the_package_dir_with_the_agents_files(
    pod: FakePodUnderTest,
) -> None:
    digest = pod.package("one", {"job.py": """
        import json, os, sys
        data = json.load(open(os.environ["FIREPOOL_INPUT_FILE"]))
        print("rank", os.environ["RANK"], "in", os.path.basename(os.getcwd()))
        json.dump({"got": data, "mine": os.path.exists("job.py")},
                  open(os.environ["FIREPOOL_OUTPUT_FILE"], "w"))
        sys.exit(int(data.get("exit", 0)))
        """})  # fmt: skip
    command = ["python3", "job.py"]
    result = await pod.run("a:1", digest, command=command, input={"n": 1},
                           system_env={"RANK": "3"})  # fmt: skip
    assert result["state"] == "succeeded", result
    assert (result["output"], result["exit_code"]) == ({"got": {"n": 1}, "mine": True}, 0)
    assert "rank 3 in pkg" in await pod.log("a:1")
    await pod.next_job("a:1")
    result = await pod.run("b:1", digest, command=command, input={"exit": 4},
                           system_env={"RANK": "0"})  # fmt: skip
    assert (result["error"]["class"], result["exit_code"]) == ("NonZeroExit", 4), result
    await pod.next_job("b:1")
    result = await pod.run("c:1", digest, command=["./no-such-program"], input=None)
    assert (result["error"]["class"], result["exit_code"]) == ("NonZeroExit", 127), result
    assert "cannot run './no-such-program'" in result["error"]["message"]


async def test_fail_creates_refuses_that_many_creates_then_creates_again(tmp_path: Path) -> None:
    backend = FakeBackend(tmp_path / "pods", fail_creates=2)
    try:
        for _ in range(2):
            with pytest.raises(CreateFailed, match="fail_creates"):
                await backend.create("cpu-a", CPU)
        assert (await backend.create("cpu-a", CPU)).name == "cpu-a"
    finally:
        await backend.shutdown()


def test_the_factory_builds_each_backend_by_name_and_refuses_others(tmp_path: Path) -> None:
    def opener(digest: str) -> BinaryIO:
        raise AssertionError("not read")

    assert isinstance(make_backend("fake", root=tmp_path, open_package=opener), FakeBackend)
    with pytest.raises(InvalidRequest, match=r"unknown pod backend 'k8s'.*local, fake") as bad:
        make_backend("k8s", root=tmp_path, open_package=opener)
    assert bad.value.field == "backend"
