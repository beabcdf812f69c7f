"""The agent's card report (``GET /gpu``) and the verdict a broker draws from its group's
reports (paper A.4), with no GPU: on this machine NVML raises ``LibraryNotFound``, which the
report must carry as "unavailable", never as an error or a clean card."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pod_runtime.agent_auth import SECRET_ENV, bearer
from pod_runtime.gpu import VISIBLE, Nvml, resolve_uuids
from pool_manager.backends.gpus import card_verdict
from pool_manager.backends.local import free_tcp_port

SECRET = "s" * 64


@pytest.fixture
def local_agent_tcp(tmp_path: Path) -> Iterator[str]:
    """A real agent on TCP told to take the cards it sees (``--gpu-uuid visible``, as an
    active GPU pod on a cluster is); its URL."""
    port = free_tcp_port("127.0.0.1")
    argv = [sys.executable, "-P", "-m", "pod_runtime.agent", "--pod-name", "p", "--pod-dir",
            str(tmp_path / "pod"), "--listen", f"tcp:127.0.0.1:{port}", "--gpu-uuid", VISIBLE,
            "--no-zygote"]  # fmt: skip
    log = (tmp_path / "agent.log").open("wb")
    proc = subprocess.Popen(argv, env={**os.environ, SECRET_ENV: SECRET}, stdout=log,
                            stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/healthz")
                break
            except httpx.HTTPError:
                assert proc.poll() is None, (tmp_path / "agent.log").read_text()
                assert time.monotonic() < deadline, "the agent never answered"
                time.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


def _nvml_here() -> bool:
    return Nvml().available


def test_without_a_driver_the_report_says_nvml_is_unavailable_and_names_no_card() -> None:
    nvml = Nvml()
    if nvml.available:  # a machine with a driver: the report lists its cards instead
        report = nvml.report([], os.getpid())
        assert report["available"] is True and report["error"] is None
        return
    report = nvml.report(["GPU-x"], os.getpid())
    assert report["available"] is False and report["cards"] == []
    assert "NVML unavailable" in report["error"]  # LibraryNotFound, as data
    assert resolve_uuids([VISIBLE], nvml) == ()  # an active pod then pins nothing
    assert resolve_uuids(["GPU-a", VISIBLE, "GPU-a"], nvml) == ("GPU-a",)


def test_the_agent_serves_its_report_to_the_broker_only(local_agent_tcp: str) -> None:
    url = local_agent_tcp
    assert httpx.get(f"{url}/gpu").status_code == 401
    report = httpx.get(f"{url}/gpu", headers=bearer(SECRET)).json()
    assert report["available"] is _nvml_here()
    if not report["available"]:
        assert report["cards"] == [] and report["error"]


def _card(uuid: str, pids: list[int], own: list[int]) -> dict[str, object]:
    return {"uuid": uuid, "compute_pids": pids, "own_pids": own}


def _report(*cards: dict[str, object], available: bool = True) -> dict[str, object]:
    return {"available": available, "error": None, "cards": list(cards)}


def test_a_card_is_exclusive_only_on_a_complete_clean_reading() -> None:
    clean = _report(_card("GPU-1", [], []))
    assert card_verdict("GPU-1", [clean]) is True
    ours = _report(_card("GPU-1", [10, 11], [10]))
    other_agent = _report(_card("GPU-1", [10, 11], [11]))
    assert card_verdict("GPU-1", [ours]) is False  # 11 is no agent's job: a foreign tenant
    assert card_verdict("GPU-1", [ours, other_agent]) is True  # each is some agent's job's


def test_a_missing_report_is_never_exclusive_and_no_answer_changes_nothing() -> None:
    unreadable = _report({"uuid": "GPU-1", "error": "card GPU-1 could not be read"})
    no_nvml = _report(available=False)
    elsewhere = _report(_card("GPU-2", [], []))
    for reports in ([unreadable], [no_nvml], [elsewhere], [no_nvml, None]):
        assert card_verdict("GPU-1", reports) is False, reports
    assert card_verdict("GPU-1", [None, None]) is None  # a failed read: nothing changes
    assert card_verdict("GPU-1", []) is None
