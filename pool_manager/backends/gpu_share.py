"""How GPU pods ask a cluster's scheduler for cards, and how the card it chose is read back
(paper §6, App. A.4): the kubernetes backend's GPU options (``GpuShare``).

An active GPU pod asks for ``units_per_pod`` of ``resource`` (``nvidia.com/gpu``), unless its
template names that resource itself. A standby asks for a fractional share of one card through
a GPU-sharing scheduler (HAMi): one unit of ``resource`` with ``standby_memory_mib`` of
``memory_resource`` (``nvidia.com/gpumem``, MiB) and ``standby_cores`` of ``cores_resource``
(``nvidia.com/gpucores``, percent of the card's cores), and is pinned to its active pod's card
by UUID with the scheduler's annotation ``uuid_annotation`` (``nvidia.com/use-gpuuuid``). The
share is only a scheduler slot: the standby's agent creates no CUDA context and allocates
nothing. For a standby to fit beside its active, the active's share must leave room: a pool
with standbys names the active's memory share in its template's ``resources.limits``
(HAMi gives a pod that names none the whole card).

The card an active pod got comes back from the scheduler's annotation on the pod
(``card_annotations``: HAMi writes the UUIDs it allocated into
``hami.io/vgpu-devices-allocated``) or, failing that, from the pod's own agent, which reports
the cards NVML shows it (``GET /gpu``).

Plain data and pure functions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

UUID_RE = re.compile(r"GPU-[0-9A-Za-z-]+")
"""A card UUID as NVML and the scheduler write it."""


@dataclass(frozen=True, slots=True)
class GpuShare:
    """The kubernetes backend's GPU resource names and a standby's share (the broker's
    ``k8s_gpu_*`` settings). An empty resource name is not asked for."""

    resource: str = "nvidia.com/gpu"
    """Whole cards (or, with HAMi, virtual cards: shares of one)."""
    memory_resource: str = "nvidia.com/gpumem"
    """A share's device memory in MiB."""
    cores_resource: str = "nvidia.com/gpucores"
    """A share's compute, in percent of the card."""
    standby_memory_mib: int = 256
    """The memory share a standby asks for: its cap, never used (it allocates nothing)."""
    standby_cores: int = 1
    """The cores share a standby asks for."""
    uuid_annotation: str = "nvidia.com/use-gpuuuid"
    """The scheduler's annotation pinning a pod to cards by UUID."""
    card_annotations: tuple[str, ...] = ("hami.io/vgpu-devices-allocated",)
    """Annotations the scheduler writes the allocated cards' UUIDs into (first found wins)."""

    def standby_limits(self) -> dict[str, int]:
        """A standby's resource limits: one share of one card."""
        limits = {self.resource: 1}
        if self.memory_resource:
            limits[self.memory_resource] = self.standby_memory_mib
        if self.cores_resource:
            limits[self.cores_resource] = self.standby_cores
        return limits

    def scheduled_cards(self, annotations: Mapping[str, Any]) -> tuple[str, ...]:
        """The cards the scheduler's annotation on a pod names, in order (none if it wrote
        none: a scheduler that does not annotate, or a pod not bound yet)."""
        for key in self.card_annotations:
            value = annotations.get(key)
            if isinstance(value, str):
                found = tuple(dict.fromkeys(UUID_RE.findall(value)))
                if found:
                    return found
        return ()
