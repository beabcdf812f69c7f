"""The local backend's GPU inventory and exclusivity sweep.

NVML cannot run on this machine (no driver): ``FakeNvml`` below stands in for it and answers
only the two calls the inventory makes (``devices``, ``compute_pids``); the process-ancestry
check runs against real processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from pod_runtime.gpu import Nvml
from pool_manager.backends.gpus import GpuInventory, descends_from, parent_pid


class FakeNvml(Nvml):
    """A test double for NVML: fixed cards and compute processes (None = unreadable)."""

    def __init__(self, devices: list[tuple[str, str]] | None, pids: set[int] | None) -> None:
        super().__init__()
        self._devices, self._pids = devices, pids

    def devices(self) -> list[tuple[str, str]] | None:
        return self._devices

    def compute_pids(self, uuids: object) -> set[int] | None:
        return self._pids


def test_declared_cards_win_over_discovery() -> None:
    inv = GpuInventory({"h200": ("GPU-a",)}, FakeNvml([("GPU-x", "NVIDIA H200")], set()))
    assert inv.cards("h200") == ("GPU-a",)


def test_discovered_cards_match_the_accelerator_by_name() -> None:
    nvml = FakeNvml([("GPU-1", "NVIDIA H200"), ("GPU-2", "NVIDIA A100-SXM4-80GB")], set())
    inv = GpuInventory({}, nvml)
    assert inv.cards("h200") == ("GPU-1",)
    assert inv.cards("a100") == ("GPU-2",)
    assert inv.cards("h100") == ()


def test_without_nvml_there_are_no_cards_and_no_verdict() -> None:
    inv = GpuInventory({}, FakeNvml(None, None))
    assert inv.cards("h200") == ()
    assert inv.exclusive("GPU-1", [os.getpid()]) is None, "a failed read verifies nothing"


def test_a_card_is_exclusive_only_when_every_compute_process_is_ours() -> None:
    pod = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess,sys,time; subprocess.Popen([sys.executable, "
            "'-c', 'import time; time.sleep(30)']); time.sleep(30)",
        ]
    )
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    child: int | None = None
    try:
        deadline = time.monotonic() + 10
        while child is None and time.monotonic() < deadline:
            kids = [p for p in os.listdir("/proc") if p.isdigit() and parent_pid(int(p)) == pod.pid]
            child = int(kids[0]) if kids else None
            time.sleep(0.05)
        assert child is not None
        assert descends_from(child, {pod.pid})
        assert not descends_from(stranger.pid, {pod.pid})
        ours = GpuInventory({}, FakeNvml([], {child}))
        theirs = GpuInventory({}, FakeNvml([], {child, stranger.pid}))
        assert ours.exclusive("GPU-1", [pod.pid]) is True
        assert theirs.exclusive("GPU-1", [pod.pid]) is False
    finally:
        for proc in (pod, stranger):
            proc.kill()
            proc.wait()
        if child is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
