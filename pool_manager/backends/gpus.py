"""GPUs on this machine for the local backend: which cards a pool may use, and the sweep.

The inventory comes from the catalog's ``gpus`` (explicit UUIDs per accelerator) or from NVML
(cards whose name matches the accelerator, e.g. ``h200`` in "NVIDIA H200"); no NVML and no
declared cards means no GPUs, and GPU pods then fail to create with a clear reason.

The exclusivity sweep (paper §6, A.4) asks NVML which processes hold a compute context on a
card; the card is exclusive when each of them descends from one of our pods. When NVML cannot
be read the answer is ``None`` and the caller must change nothing (fail closed: a card is
never verified without a successful read).

Blocking (NVML, /proc): call from a worker thread.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pod_runtime.gpu import Nvml


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[1]) if len(fields) > 1 else None


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


class GpuInventory:
    def __init__(self, declared: Mapping[str, tuple[str, ...]], nvml: Nvml | None = None):
        self.declared = dict(declared)
        self.nvml = nvml or Nvml()

    def cards(self, accelerator: str) -> tuple[str, ...]:
        """The UUIDs a pool of ``accelerator`` may use, in a stable order."""
        if accelerator in self.declared:
            return self.declared[accelerator]
        devices = self.nvml.devices() or []
        want = _norm(accelerator)
        return tuple(uuid for uuid, name in devices if want and want in _norm(name))

    def exclusive(self, gpu: str, pod_pids: Iterable[int]) -> bool | None:
        """True iff every compute process on ``gpu`` belongs to one of our pods (whose
        launcher pids are ``pod_pids``); None when the card cannot be read."""
        pids = self.nvml.compute_pids([gpu])
        if pids is None:
            return None
        ours = set(pod_pids)
        return all(descends_from(pid, ours) for pid in pids)
