"""GPUs on this machine for the local backend (which cards a pool may use, and the sweep), and
the verdict on a card read from its pods' own agents (``card_verdict``: the kubernetes
backend, whose broker cannot read a node's cards).

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
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pod_runtime.gpu import Nvml, descends_from, parent_pid

__all__ = ["GpuInventory", "card_verdict", "descends_from", "parent_pid"]


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


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


def card_verdict(card: str, reports: Sequence[Mapping[str, Any] | None]) -> bool | None:
    """Exclusivity of ``card`` from its group's agents' reports (``pod_runtime.gpu.Nvml.report``,
    one per pod pinned to the card; None for an agent that did not answer).

    Fails closed (paper A.4): None, "change nothing", when no agent answered (a failed read);
    False when those that answered could not read the card (NVML missing, the card absent
    from every report, its processes unreadable: the report is missing); True only when a
    complete reading lists no compute process that is not some group agent's own job's."""
    answered = [r for r in reports if r is not None]
    if not answered:
        return None
    readings = [
        c
        for r in answered
        if r.get("available")
        for c in r.get("cards") or ()
        if isinstance(c, Mapping) and c.get("uuid") == card and "compute_pids" in c
    ]
    if not readings:
        return False
    compute = {int(p) for c in readings for p in c.get("compute_pids") or ()}
    own = {int(p) for c in readings for p in c.get("own_pids") or ()}
    return compute <= own
