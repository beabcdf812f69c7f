"""GPU facts from NVML, without ever creating a CUDA context (paper §6, A.4).

NVML (``libnvidia-ml``, via nvidia-ml-py) reads card memory and compute processes without a
CUDA context. Everything here degrades to "unknown" when NVML is missing (no driver: NVML
raises ``LibraryNotFound``) and never raises. A standby agent calls nothing here until a job
arrives, so it maps no NVIDIA library while it waits (``Nvml`` initialises lazily).

The card report (``Nvml.report``, served by the agent at ``GET /gpu``) is what a broker that
cannot read the card itself (a pod on a cluster node) judges exclusivity from: each card's
compute processes as NVML lists them, and which of them descend from this agent (its job's).
Attribution walks ``/proc``: NVML gives host pids, which a pod sees only where it shares the
host's PID namespace or its driver translates pids into the pod's namespace; elsewhere a job's
own processes are not attributed and its card reads non-exclusive while it runs (never the
other way round).

``VISIBLE``: the ``--gpu-uuid`` value meaning "every card NVML shows this process" (a
container on a cluster node sees only the cards its scheduler gave it); ``resolve_uuids``
turns it into UUIDs at the agent's start, or into none when NVML cannot be read.

Blocking calls; the agent runs them in a worker thread. One ``Nvml`` per agent.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

from pod_runtime.proctree import read_proc

MiB = 1024 * 1024
COMPUTE_GONE_WAIT_S = 2.0
VISIBLE = "visible"
"""``--gpu-uuid visible``: the cards NVML shows (``resolve_uuids``)."""


def parent_pid(pid: int) -> int | None:
    proc = read_proc(pid)
    return proc.ppid if proc is not None else None


def descends_from(pid: int, ancestors: set[int]) -> bool:
    """Whether ``pid`` is one of ``ancestors`` or below one of them (bounded walk)."""
    for _ in range(64):
        if pid in ancestors:
            return True
        parent = parent_pid(pid)
        if parent is None or parent <= 1:
            return False
        pid = parent
    return False


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

    def report(self, uuids: Sequence[str], root_pid: int) -> dict[str, Any]:
        """The card report ``GET /gpu`` answers: ``available`` (NVML could be read),
        ``error`` (why not), and per card (``uuids``, or every card NVML shows when empty)
        its ``uuid``, ``name``, ``memory_total_mib``, ``memory_used_mib``, ``compute_pids``
        and ``own_pids`` (those below ``root_pid``: this agent's jobs). A card whose processes
        cannot be read carries ``error`` instead of pid lists: its report is missing, and a
        broker must not call it exclusive."""
        nvml = self._init()
        if nvml is None:
            return {"available": False, "error": self.error, "cards": []}
        if not uuids:
            devices = self.devices()
            if devices is None:
                return {"available": False, "error": "NVML lists no devices", "cards": []}
            uuids = [uuid for uuid, _ in devices]
        return {"available": True, "error": None,
                "cards": [self._card(nvml, uuid, root_pid) for uuid in uuids]}  # fmt: skip

    def _card(self, nvml: Any, uuid: str, root_pid: int) -> dict[str, Any]:
        card: dict[str, Any] = {"uuid": uuid}
        try:
            handle = self._handle(nvml, uuid)
            card["name"] = _text(nvml.nvmlDeviceGetName(handle))
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            card["memory_total_mib"] = int(memory.total // MiB)
            card["memory_used_mib"] = int(memory.used // MiB)
            pids = sorted({int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)})
        except Exception as exc:
            card["error"] = f"card {uuid} could not be read: {exc!r}"
            return card
        card["compute_pids"] = pids
        card["own_pids"] = [pid for pid in pids if descends_from(pid, {root_pid})]
        return card


def resolve_uuids(requested: Sequence[str], nvml: Nvml) -> tuple[str, ...]:
    """``requested`` with ``VISIBLE`` replaced by the cards NVML shows (none when it cannot
    be read: the pod then runs its jobs with no GPU pinning, and reports NVML missing)."""
    out: list[str] = []
    for uuid in requested:
        if uuid == VISIBLE:
            out += [u for u, _ in nvml.devices() or () if u not in out]
        elif uuid not in out:
            out.append(uuid)
    return tuple(out)
