"""The pod backend contract, shared by every implementation (local processes, Kubernetes).

Guarantees every backend gives:
- pod names are unique for the backend's lifetime (the caller picks them; ``create`` refuses a
  name that exists);
- ``list`` is eventually consistent: a pod created or deleted may appear or vanish a moment late;
- errors are returned as data where the caller must decide (``create`` returns a failure reason
  rather than raising for capacity problems); programming errors raise;
- a pod outlives the broker process, and its labels/annotations survive a broker restart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pool_manager.catalog import PoolSpec


@dataclass(slots=True)
class BackendPod:
    """What the backend reports about one pod."""

    name: str
    sku: str
    role: str
    created: float
    endpoint: str
    """Where the pod agent listens: ``unix:/path`` or ``tcp:host:port``."""
    alive: bool = True
    gpu: str | None = None
    template: str = "v1"
    annotations: dict[str, str] = field(default_factory=dict)


class PodBackend(Protocol):
    async def create(
        self, name: str, pool: PoolSpec, role: str = "active", gpu: str | None = None
    ) -> BackendPod:
        """Start a pod; returns as soon as it is requested (readiness is probed separately)."""
        ...

    async def delete(self, name: str) -> None:
        """Stop the pod and everything in it; idempotent."""
        ...

    async def list(self) -> list[BackendPod]:
        """Every pod this backend owns, with its labels and annotations."""
        ...

    async def annotate(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge annotations (``None`` removes a key); best-effort, never blocks a job."""
        ...

    async def sweep(self, gpus: Sequence[str]) -> dict[str, bool]:
        """For each card that could be read: True iff only this broker's pods use it (paper
        A.4). Cards that could not be read are left out (the caller changes nothing)."""
        ...

    async def exited(self, name: str) -> bool:
        """True when the pod is known to have stopped (its processes gone, say killed while
        it started); False when it runs or cannot be told. Cheap: probed while waiting for
        readiness, so a dead pod is not waited for until the ready timeout."""
        ...

    async def close(self) -> None:
        """Release backend resources; pods keep running."""
        ...
