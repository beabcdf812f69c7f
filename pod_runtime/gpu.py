"""GPU facts from NVML, without ever creating a CUDA context (paper §6, A.4).

NVML (``libnvidia-ml``, via nvidia-ml-py) reads card memory and compute processes without a
CUDA context. Everything here degrades to "unknown" when NVML is missing (no driver: NVML
raises ``LibraryNotFound``) and never raises. A standby agent calls nothing here until a job
arrives, so it maps no NVIDIA library while it waits (``Nvml`` initialises lazily).

Blocking calls; the agent runs them in a worker thread. One ``Nvml`` per agent.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

MiB = 1024 * 1024
COMPUTE_GONE_WAIT_S = 2.0


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Nvml:
    """Lazy NVML handle: ``available`` is decided at the first query, then fixed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._module: Any = None
        self._state: bool | None = None
        self.error = ""

    def _init(self) -> Any:
        with self._lock:
            if self._state is None:
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self._module, self._state = pynvml, True
                except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded...
                    self._state, self.error = False, f"NVML unavailable: {exc!r}"
            return self._module if self._state else None

    @property
    def available(self) -> bool:
        return self._init() is not None

    def _handle(self, nvml: Any, uuid: str) -> Any:
        return nvml.nvmlDeviceGetHandleByUUID(uuid)

    def devices(self) -> list[tuple[str, str]] | None:
        """``(uuid, name)`` of every card, ``None`` when NVML is unavailable."""
        nvml = self._init()
        if nvml is None:
            return None
        out = []
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid, name = nvml.nvmlDeviceGetUUID(handle), nvml.nvmlDeviceGetName(handle)
                out.append((_text(uuid), _text(name)))
        except Exception:
            return None
        return out

    def memory_mib(self, uuids: Sequence[str]) -> tuple[int | None, ...]:
        """Each card's total framebuffer in MiB, ``None`` where unknown."""
        nvml = self._init()
        out: list[int | None] = []
        for uuid in uuids:
            try:
                total = nvml.nvmlDeviceGetMemoryInfo(self._handle(nvml, uuid)).total
                out.append(int(total // MiB))
            except Exception:
                out.append(None)
        return tuple(out)

    def compute_pids(self, uuids: Sequence[str]) -> set[int] | None:
        """Host pids with a compute context on these cards; ``None`` when unknown."""
        nvml = self._init()
        if nvml is None:
            return None
        pids: set[int] = set()
        try:
            for uuid in uuids:
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(self._handle(nvml, uuid)):
                    pids.add(int(proc.pid))
        except Exception:
            return None
        return pids

    def wait_compute_gone(self, uuids: Sequence[str], wait_s: float = COMPUTE_GONE_WAIT_S) -> str:
        """Wait until no compute process is on the cards; return a problem or ``""``.

        Standbys hold no context, so any process left on the card after the job's tree died
        is residue (or a foreign tenant, which the broker's exclusivity sweep handles).
        """
        if not uuids:
            return ""
        deadline = time.monotonic() + wait_s
        while True:
            pids = self.compute_pids(uuids)
            if pids is None or not pids:
                return ""
            if time.monotonic() > deadline:
                return f"GPU compute processes still present after reset: {sorted(pids)[:5]}"
            time.sleep(0.02)

    async def check_after_reset(self, uuids: Sequence[str]) -> str | None:
        problem = await asyncio.to_thread(self.wait_compute_gone, uuids)
        return problem or None
