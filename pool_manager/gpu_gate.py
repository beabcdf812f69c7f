"""Active–standby groups and the per-GPU gate (paper §6, App. A.4).

A *group* is every pod pinned to one physical GPU: one active pod and up to
``standbys_per_active`` zero-VRAM standbys (a promoted standby becomes active, so a group may
briefly hold two used pods). The group counts once in every ceiling and budget.

The *gate* lets at most one pod per GPU hold a job. It closes when a pod of the group is
claimed and opens only when that pod's reset reported the job's processes verified dead (a
clean release) or the pod is gone; an unclean release keeps it closed until deletion. While
it is closed, the group's idle pods are parked: out of every claim bucket.

*Exclusivity* is verified per GPU by a periodic sweep (every share on the card belongs to
this group). It fails closed: unknown, failed or stale after a restart means no promotion.

Concurrency: plain data owned by the tracker and touched only under its lock.
"""

from __future__ import annotations


class GpuGroup:
    """The pods on one physical GPU and who holds its gate."""

    __slots__ = ("gate", "gpu", "pods", "sku")

    def __init__(self, gpu: str, sku: str) -> None:
        self.gpu = gpu
        self.sku = sku
        self.pods: dict[str, None] = {}
        """Every tracked pod on this GPU, any state, any role (insertion ordered)."""
        self.gate: str | None = None
        """The pod holding the GPU (assigned, running, or released unclean); ``None`` = open."""

    @property
    def is_open(self) -> bool:
        return self.gate is None

    def __repr__(self) -> str:
        return (
            f"GpuGroup({self.gpu!r}, sku={self.sku!r}, pods={list(self.pods)}, gate={self.gate!r})"
        )
