"""The NVIDIA driver of an emulated node (``k8s_node_emulator``), as the few ``pynvml`` calls
``pod_runtime.gpu`` makes see it: put first on the ``PYTHONPATH`` of the agents the node
emulator starts, it stands in for nvidia-ml-py there and nowhere else.

State: the JSON file ``FIREPOOL_TEST_NVML_STATE`` names (the node's cards, written by the
emulator and by tests), read afresh on every call so a test changes a card while agents run:
``{"cards": [{"uuid", "name", "memory_total_mib", "readable", "processes": [{"pid",
"used_mib"}]}]}``. A process sees only the cards ``FIREPOOL_TEST_NVML_VISIBLE`` lists (comma
separated), as a container sees only those its scheduler gave it.

What it is not: no card exists, so no CUDA context, no allocation and no real compute process
ever shows here; the processes listed are exactly those a test wrote (its own pids or pids
of the pods' jobs it chose), and memory used is their sum. A missing state file is a driver
that is not loaded (``nvmlInit`` raises ``NVMLError_LibraryNotFound``); ``readable: false``
makes that card's process list fail, as a card in a bad state does.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

MiB = 1024 * 1024


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class NVMLError_NotFound(NVMLError):
    pass


class NVMLError_Unknown(NVMLError):
    pass


@dataclass
class _Memory:
    total: int
    used: int
    free: int


@dataclass
class _Process:
    pid: int
    usedGpuMemory: int


def _cards() -> list[dict[str, Any]]:
    path = os.environ.get("FIREPOOL_TEST_NVML_STATE", "")
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        raise NVMLError_LibraryNotFound("emulated driver not loaded") from None
    visible = set(filter(None, os.environ.get("FIREPOOL_TEST_NVML_VISIBLE", "").split(",")))
    return [c for c in state.get("cards", []) if c["uuid"] in visible]


def _card(handle: str) -> dict[str, Any]:
    for card in _cards():
        if card["uuid"] == handle:
            return card
    raise NVMLError_NotFound(handle)


def nvmlInit() -> None:
    _cards()


def nvmlDeviceGetCount() -> int:
    return len(_cards())


def nvmlDeviceGetHandleByIndex(index: int) -> str:
    return str(_cards()[index]["uuid"])


def nvmlDeviceGetHandleByUUID(uuid: str | bytes) -> str:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    return str(_card(uuid)["uuid"])


def nvmlDeviceGetUUID(handle: str) -> str:
    return str(_card(handle)["uuid"])


def nvmlDeviceGetName(handle: str) -> str:
    return str(_card(handle).get("name", "NVIDIA H200"))


def _processes(card: dict[str, Any]) -> list[_Process]:
    if not card.get("readable", True):
        raise NVMLError_Unknown(f"card {card['uuid']} cannot be read")
    return [_Process(int(p["pid"]), int(p.get("used_mib", 0)) * MiB)
            for p in card.get("processes", [])]  # fmt: skip


def nvmlDeviceGetMemoryInfo(handle: str) -> _Memory:
    card = _card(handle)
    total = int(card.get("memory_total_mib", 143771)) * MiB
    used = sum(p.usedGpuMemory for p in _processes(card)) if card.get("readable", True) else 0
    return _Memory(total, used, total - used)


def nvmlDeviceGetComputeRunningProcesses(handle: str) -> list[_Process]:
    return _processes(_card(handle))
