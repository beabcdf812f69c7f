"""The pod backend contract, shared by every implementation (local processes, the in-process
fake, Kubernetes). ``tests/backends/test_backend_contract.py`` holds every implementation to it.

Guarantees every backend gives:
- pod names are unique within the backend's state (the caller picks them; ``create`` refuses a
  name that exists);
- ``list`` is eventually consistent: a pod created or deleted may appear or vanish a moment
  late (the local and fake backends are exact);
- a failure the caller must decide about is a typed error: ``create`` raises ``CreateFailed``
  when the pod cannot be made now, and no pod of that name exists afterwards; a programming
  error (a name in use, a standby without its card) raises ``ValueError``;
- a pod outlives the backend object and the broker process; a new backend object over the same
  state (what "same state" is, each implementation's docstring says) lists the pods an earlier
  one made, with their labels and annotations, so a restarted broker can rebuild its view.

Readiness is not the backend's business: a created pod is ready once its agent answers
``GET /healthz`` with 200 at the endpoint ``create`` returned (docs/architecture.md §1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from pool_manager.catalog import PoolSpec


class CreateFailed(RuntimeError):
    """The backend could not make the pod now (no free card, a quota, the API refused).
    Nothing of the pod is left behind; the caller may try again later."""


@dataclass(slots=True)
class BackendPod:
    """What the backend reports about one pod."""

    name: str
    sku: str
    role: str
    """``active`` or ``standby``."""
    created: float
    """Epoch seconds when the create was requested."""
    endpoint: str
    """Where the pod agent listens: ``unix:/path`` or ``tcp:host:port``."""
    alive: bool = True
    """False once the pod is known to have stopped (``PodBackend.exited``); a dead pod stays
    listed until it is deleted."""
    gpu: str | None = None
    """The card the pod is pinned to (the first, for a pod of several); None for CPU pods."""
    template: str = "v1"
    annotations: dict[str, str] = field(default_factory=dict)
    """The pod's annotations as last written by ``annotate``."""

    @property
    def host(self) -> str:
        """The address other pods reach this pod at (``endpoint_host``)."""
        return endpoint_host(self.endpoint)


def endpoint_host(endpoint: str) -> str:
    """The address other pods reach the pod of agent ``endpoint`` at: the host of a
    ``tcp:HOST:PORT`` endpoint (a pod's IP on a cluster), ``127.0.0.1`` for a ``unix:`` one
    (a local pod shares the broker's host)."""
    if endpoint.startswith("tcp:"):
        host = endpoint[4:].partition("#")[0].rpartition(":")[0]
        return host.strip("[]") or "127.0.0.1"
    return "127.0.0.1"


class PodBackend(Protocol):
    rendezvous_port: int | None
    """The port a gang's rank 0 pod owns for its ranks' rendezvous (``MASTER_PORT``), declared
    on every pod this backend makes, each reached at its own address (``BackendPod.host``).
    None: pods share the broker's host, so a free port is picked for each gang attempt."""

    async def create(
        self, name: str, pool: PoolSpec, role: str = "active", gpu: str | None = None
    ) -> BackendPod:
        """Start a pod of ``pool`` named ``name``; return as soon as it is requested (readiness
        is probed separately, at the returned endpoint). From then until ``delete`` the pod is
        listed, with no annotations. A standby shares the card ``gpu`` of its active pod.
        Raises ``CreateFailed`` when the pod cannot be made now, ``ValueError`` for a name in
        use or a standby without ``gpu``."""
        ...

    async def delete(self, name: str) -> None:
        """Stop the pod and everything in it, and forget it: once this returns, the pod is not
        listed, its endpoint answers nothing and ``exited`` is True. Idempotent: deleting a pod
        that is gone (or was never made) is no error."""
        ...

    async def list(self) -> list[BackendPod]:
        """Every pod in this backend's state, those earlier backend objects made over the same
        state included (restart recovery), dead ones with ``alive=False``, each with its
        annotations."""
        ...

    async def annotate(self, name: str, annotations: Mapping[str, str | None]) -> None:
        """Merge ``annotations`` into the pod's (``None`` removes a key; other keys are kept).
        Durable once it returns: a new backend object over the same state lists them. A pod
        that is gone is no error (nothing is written). Raises if the write fails: a caller
        that must not go on without it (``broker.pods.PodManager.persist_owner``) relies on
        that; callers for whom it is best-effort catch it."""
        ...

    async def sweep(self, gpus: Sequence[str]) -> dict[str, bool]:
        """For each card that could be read: True iff only this broker's pods use it (paper
        A.4). Cards that could not be read are left out (the caller changes nothing)."""
        ...

    async def exited(self, name: str) -> bool:
        """True when the pod is known to have stopped (its processes gone, say killed while
        it started) or is not known at all (deleted); False while it runs or when it cannot
        be told. Cheap: probed while waiting for readiness, so a dead pod is not waited for
        until the ready timeout."""
        ...

    async def close(self) -> None:
        """Release this backend object's resources; the pods keep running, for a new backend
        object over the same state to list."""
        ...
